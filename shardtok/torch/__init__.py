"""PyTorch adapters (the only part of shardtok that imports torch)."""

from shardtok.torch.checkpoint import dataset_states
from shardtok.torch.dataset import ShardStreamDataset
from shardtok.torch.loader import LoaderWorkerError, MemmapLoader, ShardLoader
from shardtok.torch.memmap_dataset import MemmapTokenDataset

# Still importable from here for code written against 0.1; listed once, in shardtok.stream.
from shardtok.stream.resume.merge import merge_states  # noqa: F401  isort: skip

__all__ = [
    "LoaderWorkerError",
    "MemmapLoader",
    "MemmapTokenDataset",
    "ShardLoader",
    "ShardStreamDataset",
    "dataset_states",
]
