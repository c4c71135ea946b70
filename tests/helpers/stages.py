"""Curriculum test data: three sources whose token ids tell them apart, and a three-stage config
(starts 1, 4, 7) over them, for tests/stream/test_stages.py and tests/torch/test_stages.py."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import yaml

from shardtok.testing.synthetic import write_synthetic_dataset

# Source i owns token ids [BASES[i], BASES[i] + SIZES[i]).
BASES = [0, 1_000_000, 2_000_000]
SIZES = [4_000, 3_000, 5_000]
OPTIONS = {"seq_len": 15, "batch_size": 2, "shuffle_buffer": 8, "seed": 3}
STARTS = [1, 4, 7]  # 1-based training steps


def write_sources(
    root: Path, sizes=SIZES, *, log_mean=3.0, shard_size=900, shard_step=200, frame_size=500
) -> list[str]:
    """Source i (folder ``s{i}``) holds `sizes[i]` tokens whose ids start at ``BASES[i]``, so a
    token names its source (``source_of``); document lengths are log-normal around `log_mean`."""
    paths = []
    for i, (base, size) in enumerate(zip(BASES, sizes)):
        rng = np.random.default_rng(i)
        lengths = np.maximum(1, rng.lognormal(log_mean, 1.0, size=size)).astype(int)
        keep = int(np.searchsorted(np.cumsum(lengths), size))  # documents that fit before size
        lengths = np.append(lengths[:keep], size - lengths[:keep].sum())
        write_synthetic_dataset(
            root / f"s{i}", lengths=lengths.tolist(), vocab_size=3_000_000, unique_tokens=True,
            first_token=base, shard_size=shard_size + shard_step * i, frame_size=frame_size,
        )  # fmt: skip
        paths.append(str(root / f"s{i}"))
    return paths


def config(paths: list[str], stage_switch: str = "restart") -> dict:
    """warmup: s0 alone; blend: s0 and s1; code: s1 and s2 with its own seed (restarting
    stages: every stage a fresh mix; ``continue`` drops the seed, which such stages share)."""
    own_seed = {"seed": 77} if stage_switch == "restart" else {}
    return {
        **OPTIONS,
        "stage_switch": stage_switch,
        "data_stages": [
            {"name": "warmup", "start_training_step": STARTS[0],
             "data": {"dataset": {"dataset_path": paths[0]}}},
            {"name": "blend", "start_training_step": STARTS[1],
             "data": {"dataset": {"dataset_path": {paths[0]: 0.5, paths[1]: 0.5}}}},
            {"name": "code", "start_training_step": STARTS[2],
             "data": {"dataset": {"dataset_path": {paths[1]: 0.3, paths[2]: 0.7}}, **own_seed}},
        ],
    }  # fmt: skip


def changed(base: dict, stage: int, path: tuple = (), value=None, start=None) -> dict:
    """`base` with stage `stage`'s ``data`` entry at `path` set to `value` (or its start)."""
    out = copy.deepcopy(base)
    entry = out["data_stages"][stage]
    if start is not None:
        entry["start_training_step"] = start
    if path:
        where = entry["data"]
        for key in path[:-1]:
            where = where[key]
        where[path[-1]] = value
    return out


def write_config(where: Path, data: dict) -> Path:
    where.write_text(yaml.safe_dump(data))
    return where


def source_of(tokens: np.ndarray) -> int:
    """The source a packed row's tokens come from (every row holds one source's tokens)."""
    owners = {int(np.searchsorted(BASES, t, side="right")) - 1 for t in np.unique(tokens)}
    assert len(owners) == 1, f"a sequence mixes sources {owners}"
    return owners.pop()
