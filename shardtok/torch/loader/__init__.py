"""shardtok's loaders: DataLoaders whose workers hand batches over through shared memory
(``lean_loader``), one for the stream (``ShardLoader``) and one for the memmap path
(``MemmapLoader``, which ``ShardLoader(memmap_dataset, batch_size=B)`` returns)."""

from shardtok.torch.loader.memmap_loader import MemmapLoader
from shardtok.torch.loader.shard_loader import ShardLoader
from shardtok.torch.loader.worker_pool import LoaderWorkerError

__all__ = ["LoaderWorkerError", "MemmapLoader", "ShardLoader"]
