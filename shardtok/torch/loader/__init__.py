"""``ShardLoader``: a DataLoader whose workers hand batches over through shared memory."""

from shardtok.torch.loader.shard_loader import ShardLoader
from shardtok.torch.loader.worker_pool import LoaderWorkerError

__all__ = ["LoaderWorkerError", "ShardLoader"]
