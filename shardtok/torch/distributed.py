"""Where this process sits in data-parallel training."""

from __future__ import annotations

import torch


def data_parallel_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Explicit arguments win (with tensor or pipeline parallelism the data-parallel rank is not
    the global rank); else torch.distributed when initialised; else a single process."""
    if rank is not None or world_size is not None:
        if rank is None or world_size is None:
            raise ValueError("give both rank and world_size, or neither")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world_size {world_size}")
        return rank, world_size
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1
