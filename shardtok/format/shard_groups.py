"""Shard groups: the unit the epoch plan permutes and the compact manifest stores together.

A dataset of N shards has ``B = min(N, GROUP_LIMIT)`` groups; group g holds the shards
``g, g + B, g + 2B, ...`` (ascending). Up to GROUP_LIMIT shards every group is one shard, so
permuting groups is permuting shards (the plan of every earlier release). Beyond it, a worker
planning its own slice needs only the B group token sums (the compact manifest's header) and
the rows of the few groups its slice touches, never all N rows; and since a group's shards are
spread evenly over the dataset, neighbours in the permuted stream still come from all over it.

The compact manifest stores rows group-major (group 0's shards, then group 1's, ...), so one
range read fetches a group. Groups ``g < N % B`` have one shard more than the others.
"""

from __future__ import annotations

import numpy as np

GROUP_LIMIT = 1 << 16  # 512 KiB of u64 group sums in the compact header


def group_count(num_shards: int) -> int:
    return min(num_shards, GROUP_LIMIT)


def group_size(group: int, num_shards: int, groups: int) -> int:
    return num_shards // groups + (group < num_shards % groups)


def group_start(group: int, num_shards: int, groups: int) -> int:
    """The group-major row of group `group`'s first shard."""
    return group * (num_shards // groups) + min(group, num_shards % groups)


def group_members(group: int, num_shards: int, groups: int) -> np.ndarray:
    """Shard indices of `group`, ascending (its rows' order in the compact manifest)."""
    return np.arange(group, num_shards, groups, dtype=np.int64)


def group_major(num_shards: int, groups: int) -> np.ndarray:
    """Shard index of each group-major row: ``order[row]``."""
    if num_shards == 0:
        return np.zeros(0, dtype=np.int64)
    grid = np.arange(-(-num_shards // groups) * groups, dtype=np.int64).reshape(-1, groups)
    order = grid.T.ravel()
    return order[order < num_shards]


def group_sums(values: np.ndarray, groups: int) -> np.ndarray:
    """Per group the sum of `values` (one per shard, in shard order), as int64."""
    values = np.asarray(values, dtype=np.int64)
    if groups == 0:
        return np.zeros(0, dtype=np.int64)
    padded = np.zeros(-(-len(values) // groups) * groups, dtype=np.int64)
    padded[: len(values)] = values
    return padded.reshape(-1, groups).sum(axis=0)
