"""Conversions between Megatron `.bin/.idx` pairs and shardtok datasets."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from shardtok.format.dataset_writer import DatasetWriter
from shardtok.format.manifest import Manifest, load_manifest
from shardtok.format.megatron import MegatronPair, write_megatron_pair
from shardtok.format.shard_reader import ShardReader, ShardStreamReader


def import_megatron(
    prefix: str | Path,
    out_dir: str | Path,
    *,
    vocab_size: int | None = None,
    tokenizer: dict | None = None,
    progress=None,
    **writer_options,
) -> Manifest:
    """Turn a pair into shards, one document per Megatron sequence, keeping the pair's dtype.

    Without `vocab_size` the vocabulary is taken as (largest token id + 1), which a pair
    cannot tell us otherwise; pass the tokenizer's real size when you know it.
    """
    pair = MegatronPair(prefix)
    if vocab_size is None:
        vocab_size = int(pair.tokens.max()) + 1 if pair.num_tokens else 1
    bin_name = Path(str(prefix) + ".bin").name
    writer = DatasetWriter(
        out_dir, vocab_size=vocab_size, tokenizer=tokenizer, dtype=pair.dtype, **writer_options
    )
    for i in range(len(pair)):
        writer.add(pair[i], provenance=(bin_name, i))
        if progress is not None:
            progress(1)
    return writer.close(extra={"imported_from": bin_name})


def iter_dataset_documents(
    folder: str | Path, manifest: Manifest | None = None
) -> Iterator[np.ndarray]:
    folder = Path(folder)
    manifest = manifest or load_manifest(folder)
    for entry in manifest.shards:
        # Read front to back: export is a local, sequential job, and the stream reader checks
        # every frame as it goes (this layer opens its own local files, as the writers do).
        path = folder / entry.file
        with open(path, "rb") as raw:
            yield from ShardStreamReader(raw, str(path)).documents()


def iter_dataset_masks(folder: str | Path, manifest: Manifest) -> Iterator[np.ndarray]:
    folder = Path(folder)
    for entry in manifest.shards:
        # Random access reads mask frames by range in order: one frame in memory at a time.
        reader = ShardReader(folder / entry.file)
        for _tokens, mask in reader.documents(with_masks=True):
            yield mask


def export_megatron(
    folder: str | Path, out_prefix: str | Path, *, masks: bool = False
) -> tuple[int, int]:
    """Merge a dataset's shards into one pair, byte-identical to megatron-core's builder output.

    `masks`: also write `OUT_PREFIX_mask.bin/.idx`, a uint8 pair (dtype code 1) with the same
    sizes, so a trainer can index tokens and loss masks alike."""
    manifest = load_manifest(folder)
    if masks and not manifest.masked:
        raise ValueError(f"{folder}: the dataset has no loss masks to export")
    result = write_megatron_pair(
        out_prefix, iter_dataset_documents(folder, manifest), manifest.dtype
    )
    if masks:
        write_megatron_pair(f"{out_prefix}_mask", iter_dataset_masks(folder, manifest), np.uint8)
    return result
