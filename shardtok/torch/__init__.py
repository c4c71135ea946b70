"""PyTorch adapters (the only part of shardtok that imports torch)."""

from shardtok.torch.checkpoint import dataset_states, merge_states
from shardtok.torch.dataset import ShardStreamDataset
from shardtok.torch.distributed import data_parallel_rank
from shardtok.torch.loader.shard_loader import LoaderWorkerError, ShardLoader
from shardtok.torch.loader.transport import to_tensors
from shardtok.torch.memmap_dataset import MemmapTokenDataset

__all__ = [
    "LoaderWorkerError",
    "MemmapTokenDataset",
    "ShardLoader",
    "ShardStreamDataset",
    "data_parallel_rank",
    "dataset_states",
    "merge_states",
    "to_tensors",
]
