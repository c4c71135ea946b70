"""Conversions between Megatron `.bin/.idx` pairs and shardtok datasets."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from shardtok.errors import CorruptShardError, UsageError
from shardtok.format.dataset_writer import DatasetWriter
from shardtok.format.identity import check_shard_identity
from shardtok.format.manifest import Manifest, ShardEntry, load_manifest
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
    cannot tell us otherwise; pass the tokenizer's real size when you know it. A
    `vocab_size` below the pair's largest id is a UsageError naming that id and where it is.
    """
    pair = MegatronPair(prefix)
    bin_path = str(prefix) + ".bin"
    largest = _check_pair_ids(pair, bin_path)
    if vocab_size is None:
        vocab_size = largest + 1
    elif not 0 < vocab_size <= int(np.iinfo(pair.dtype).max) + 1:
        raise UsageError(
            f"{bin_path}: vocab_size {vocab_size} does not fit the pair's {pair.dtype} token ids "
            f"(1..{int(np.iinfo(pair.dtype).max) + 1})"
        )
    elif largest >= vocab_size:
        at = int(np.argmax(pair.tokens))
        sequence = int(np.searchsorted(pair.offsets, at, side="right")) - 1
        raise UsageError(
            f"{bin_path}, byte offset {at * pair.dtype.itemsize} (sequence {sequence}): the "
            f"largest token id is {largest}, outside vocab_size (--vocab-size) {vocab_size} (ids 0.."
            f"{vocab_size - 1}); pass the tokenizer's real vocabulary size"
        )
    bin_name = Path(bin_path).name
    writer = DatasetWriter(
        out_dir, vocab_size=vocab_size, tokenizer=tokenizer, dtype=pair.dtype, **writer_options
    )
    for i in range(len(pair)):
        writer.add(pair[i], provenance=(bin_name, i))
        if progress is not None:
            progress(1)
    return writer.close(extra={"imported_from": bin_name})


def _check_pair_ids(pair: MegatronPair, bin_path: str) -> int:
    """The largest token id of the pair (0 when it has none); a negative id is bad data, which
    no vocabulary size can fix, so it is refused here with its place in the .bin."""
    if not pair.num_tokens:
        return 0
    if pair.dtype.kind == "i":
        at = int(np.argmin(pair.tokens))
        if pair.tokens[at] < 0:
            raise CorruptShardError(
                bin_path, None, at * pair.dtype.itemsize, f"token id {pair.tokens[at]} is negative"
            )
    return int(pair.tokens.max())


def iter_dataset_documents(
    folder: str | Path, manifest: Manifest | None = None
) -> Iterator[np.ndarray]:
    folder = Path(folder)
    manifest = manifest or load_manifest(folder)
    for entry in manifest.shards:
        # Read front to back: export is a local, sequential job, and the stream reader checks
        # every frame as it goes (this layer opens its own local files, as the writers do).
        with _open_listed(folder, entry, manifest) as reader:
            yield from reader.documents()


@contextmanager
def _open_listed(
    folder: Path, entry: ShardEntry, manifest: Manifest
) -> Iterator[ShardStreamReader]:
    """Shard `entry` opened and checked as the stream checks a shard against its manifest entry
    (file size, key, counts, dtype, vocabulary, tokenizer, meta_sha256) before one frame is
    decoded: counts that match the manifest are what bound each frame's decoded size, so a
    foreign shard declaring gigabytes is refused from its head."""
    where = str(folder / entry.file)
    with open(where, "rb") as raw:
        size = os.fstat(raw.fileno()).st_size
        reader = ShardStreamReader(raw, where, size=size)
        check_shard_identity(reader.meta, entry, manifest, where, size)
        yield reader


def check_dataset_shards(folder: str | Path, manifest: Manifest) -> None:
    """Every listed shard's head checked against the manifest (a few KB read per shard), so an
    export refuses a foreign or contradicted shard before it writes its first byte."""
    folder = Path(folder)
    for entry in manifest.shards:
        with _open_listed(folder, entry, manifest):
            pass


def iter_dataset_masks(folder: str | Path, manifest: Manifest) -> Iterator[np.ndarray]:
    folder = Path(folder)
    for entry in manifest.shards:
        # Random access reads mask frames by range in order: one frame in memory at a time.
        reader = ShardReader(folder / entry.file)
        check_shard_identity(
            reader.meta, entry, manifest, str(folder / entry.file), reader.source.size
        )
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
        raise UsageError(f"{folder}: the dataset has no loss masks to export")
    check_dataset_shards(folder, manifest)
    # Only now: an export refused for a shard leaves no trace where its output would go.
    Path(out_prefix).parent.mkdir(parents=True, exist_ok=True)
    result = write_megatron_pair(
        out_prefix, iter_dataset_documents(folder, manifest), manifest.dtype
    )
    if masks:
        write_megatron_pair(f"{out_prefix}_mask", iter_dataset_masks(folder, manifest), np.uint8)
    return result
