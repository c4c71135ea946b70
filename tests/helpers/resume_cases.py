"""Shared by test_resume_exact.py and its fresh-process half (resume_worker.py): the datasets,
the loaders and how batches are collected, so both processes build exactly the same thing."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from shardtok.testing.synthetic import write_synthetic_dataset

OPTIONS = dict(seq_len=31, batch_size=4, shuffle_buffer=24, seed=11)
MIX_BATCHES = 30  # per rank
KEYS = ("input_ids", "labels", "position_ids", "document_ids", "cu_seqlens")


def write_datasets(root: Path) -> dict[str, str]:
    """Three small datasets with uneven shards; 'small' runs out often inside a mix."""
    out = {}
    for name, tokens, shard in (
        ("big", 14_000, 2_500),
        ("mid", 7_000, 1_300),
        ("small", 2_200, 900),
    ):
        write_synthetic_dataset(
            root / name, num_tokens=tokens, vocab_size=4000, mean_length=45, shard_size=shard,
            frame_size=600, seed=len(name),
        )  # fmt: skip
        out[name] = str(root / name)
    return out


def make_dataset(paths: dict[str, str], case: dict):
    from shardtok.torch import ShardStreamDataset

    options = {**OPTIONS, "packing": case["packing"]}
    placement = {"rank": case["rank"], "world_size": case["world"]}
    if case["kind"] == "mix":
        mix = {paths["big"]: 0.5, paths["mid"]: 0.2, paths["small"]: 0.3}
        return ShardStreamDataset(mix, num_batches=MIX_BATCHES, **options, **placement)
    return ShardStreamDataset(paths["big"], **options, **placement)


def make_loader(paths: dict[str, str], case: dict):
    from torchdata.stateful_dataloader import StatefulDataLoader

    return StatefulDataLoader(
        make_dataset(paths, case), batch_size=None, num_workers=case["workers"]
    )


def epochs_of(case: dict) -> int:
    """'boundary' runs two epochs (the save point lies in the first)."""
    return 2 if case["kind"] == "boundary" else 1


def as_arrays(batch: dict) -> dict[str, np.ndarray]:
    return {k: batch[k].numpy().copy() for k in KEYS}


def run_rest(loader, case: dict, start_epoch: int) -> list[dict]:
    """Iterate `loader` to the end of the case's last epoch, from `start_epoch`."""
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchdata's own deprecation notices
        for epoch in range(start_epoch, epochs_of(case)):
            if epoch != start_epoch:
                loader.dataset.set_epoch(epoch)
            out.extend(as_arrays(b) for b in loader)
    return out
