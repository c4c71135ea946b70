"""shardtok, memmap path: uncompressed tar shards (the .bin member is 512-byte aligned inside the
tar, so it is memory-mapped in place), read by `shardtok.torch.memmap_dataset.MemmapTokenDataset`
(Megatron GPTDataset samples: document, sample and shuffle indices, cached on disk) under
`shardtok.torch.ShardLoader(dataset, batch_size=8)`, the DataLoader subclass shardtok
recommends (same batches as `DataLoader(batch_size=8, collate_fn=dataset.collate)`)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.compare.systems import shardtok_stream
from shardtok.torch import ShardLoader
from shardtok.torch.memmap_dataset import MemmapTokenDataset

LABEL = "shardtok memmap"
LAYOUT = "uncompressed tar shards, .bin mapped in place; MemmapTokenDataset (GPTDataset samples, cached index); ShardLoader(batch_size=8) (a DataLoader)"


def write(source, out: Path, options) -> None:
    shardtok_stream.write(source, out, options, compression_level=None)


def _dataset(out: Path, options) -> MemmapTokenDataset:
    return MemmapTokenDataset(
        out, seq_len=options.seq_len, seed=options.seed, cache_dir=Path(out) / "index-cache"
    )


def prepare(out: Path, source, options) -> None:
    _dataset(out, options)


def loader(out: Path, source, options):
    dataset = _dataset(out, options)
    return ShardLoader(
        dataset, batch_size=options.batch_size, num_workers=options.num_workers, drop_last=True
    )


def training_inputs(batch):
    return batch["input_ids"], batch["labels"], batch["position_ids"]
