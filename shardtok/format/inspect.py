"""Summaries of shards and datasets for `shardtok inspect` (reads heads only, never the tokens).

The format layer does not know where bytes live: callers hand in sources they opened (a path or
URL goes through ``shardtok.storage``; ``shardtok inspect`` does that), so the same summary
serves local folders and remote prefixes.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np

from shardtok.format.compact_manifest import COMPACT_NAME
from shardtok.format.manifest import MANIFEST_NAME, Manifest
from shardtok.format.shard_reader import RangeSource, ShardHead, read_source_head

PERCENTILES = (0, 10, 50, 90, 99, 100)


def _head_of(source: RangeSource, where: str) -> ShardHead:
    try:
        return read_source_head(source, where)
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()


def _length_stats(sizes: np.ndarray) -> dict:
    if len(sizes) == 0:
        return {f"p{p}": 0 for p in PERCENTILES} | {"mean": 0.0}
    values = np.percentile(sizes, PERCENTILES, method="lower")
    return {f"p{p}": int(v) for p, v in zip(PERCENTILES, values)} | {
        "mean": round(float(sizes.mean()), 2)
    }


def inspect_shard(source: RangeSource, where: str) -> dict:
    """A JSON-able summary of one shard; `source` is closed when done."""
    head = _head_of(source, where)
    meta = head.meta
    return {
        "kind": "shard",
        "path": where,
        "key": meta.key,
        "dtype": meta.dtype.name,
        "vocab_size": meta.vocab_size,
        "tokenizer": meta.tokenizer,
        "num_documents": meta.num_documents,
        "num_tokens": meta.num_tokens,
        "compression": meta.compression,
        "compression_level": meta.compression_level,
        "num_frames": len(meta.frames),
        "token_bytes": meta.bin_nbytes,
        "stored_bytes": meta.stored_bin_nbytes,
        "compression_ratio": _ratio(meta.bin_nbytes, meta.stored_bin_nbytes),
        "document_length": _length_stats(head.index.sizes),
        "provenance": list(meta.provenance),
    } | _trained(None if meta.mask is None else meta.mask.trained_tokens, meta.num_tokens)


def inspect_dataset(
    manifest: Manifest,
    open_shard: Callable[[str], RangeSource],
    where: str,
    where_of: Callable[[str], str],
    *,
    dataset_shards: int | None = None,
) -> dict:
    """A JSON-able summary of a dataset: `open_shard(file)` opens each shard the manifest lists,
    `where_of(file)` names it in errors, `where` names the dataset.

    `dataset_shards`: `manifest` is a view of some of a dataset's shards (a subset), and the
    dataset has this many; the summary then counts the subset and says so (``subset_of``,
    ``shards``)."""
    sizes, frames, token_bytes, stored = [], 0, 0, 0
    compression = set()
    for entry in manifest.shards:
        head = _head_of(open_shard(entry.file), where_of(entry.file))
        sizes.append(np.asarray(head.index.sizes))
        frames += len(head.meta.frames)
        token_bytes += head.meta.bin_nbytes
        stored += head.meta.stored_bin_nbytes
        compression.add(head.meta.compression)
    all_sizes = np.concatenate(sizes) if sizes else np.zeros(0, dtype=np.int32)
    return (
        {
            "kind": "dataset",
            "path": where,
            "manifest": MANIFEST_NAME,
            "name": manifest.name,
            "dtype": manifest.dtype.name,
            "vocab_size": manifest.vocab_size,
            "tokenizer": manifest.tokenizer,
            "num_shards": len(manifest.shards),
            "num_documents": manifest.num_documents,
            "num_tokens": manifest.num_tokens,
            "dataset_bytes": manifest.num_bytes,
            "compression": sorted(compression),
            "num_frames": frames,
            "token_bytes": token_bytes,
            "stored_bytes": stored,
            "compression_ratio": _ratio(token_bytes, stored),
            "document_length": _length_stats(all_sizes),
            "extra": manifest.extra,
        }
        | _trained(manifest.trained_tokens, manifest.num_tokens, manifest.sft)
        | _subset(manifest, dataset_shards)
    )


def _subset(manifest: Manifest, dataset_shards: int | None) -> dict:
    """Subsets only, so whole datasets' summaries keep their keys."""
    if dataset_shards is None:
        return {}
    return {"subset_of": dataset_shards, "shards": [e.file for e in manifest.shards]}


def _trained(trained: int | None, tokens: int, sft: dict | None = None) -> dict:
    """Masked data only, so summaries of other datasets keep their keys."""
    if trained is None:
        return {}
    share = round(100 * trained / tokens, 2) if tokens else 0.0
    out = {"trained_tokens": trained, "trained_percent": share}
    return out if sft is None else out | {"sft": sft}


def _manifests_line(manifests: dict) -> str:
    json_size = manifests[MANIFEST_NAME]["bytes"]
    compact = manifests.get(COMPACT_NAME)
    text = f"{MANIFEST_NAME} {json_size:,} bytes; "
    if compact is None:
        return (
            text
            + f"no {COMPACT_NAME} (a dataset of an earlier release: workers read {MANIFEST_NAME} whole)"
        )
    text += f"{COMPACT_NAME} {compact['bytes']:,} bytes, "
    if compact["agrees"]:
        return text + "agrees with it"
    return text + "DOES NOT AGREE with it: " + "; ".join(compact["differences"])


def _ratio(raw: int, stored: int) -> float:
    return round(raw / stored, 3) if stored else 1.0


def format_summary(summary: dict) -> str:
    """Human-readable text for the terminal."""
    lines = []
    if summary["kind"] == "dataset" and "subset_of" in summary:
        names = summary["shards"]
        shown = ", ".join(names if len(names) <= 4 else [names[0], "...", names[-1]])
        lines.append(
            f"dataset {summary['path']} ({summary['name']}-*.tar): {summary['num_shards']} of its "
            f"{summary['subset_of']} shards ({shown}); the counts below are theirs"
        )
    elif summary["kind"] == "dataset":
        lines.append(
            f"dataset {summary['path']} ({summary['name']}-*.tar, {summary['num_shards']} shards)"
        )
    else:
        lines.append(f"shard {summary['path']} (key {summary['key']})")
    tok = summary.get("tokenizer") or {}
    lines += [
        f"  documents       {summary['num_documents']:,}",
        f"  tokens          {summary['num_tokens']:,}",
        f"  dtype           {summary['dtype']} (vocab {summary['vocab_size']:,})",
        f"  tokenizer       {tok.get('name', '?')} fingerprint {str(tok.get('fingerprint', '?'))[:23]}"
        f" eos {tok.get('eos_id')} bos {tok.get('bos_id')}",
        f"  frames          {summary['num_frames']:,}",
        f"  compression     {summary['compression']} ratio {summary['compression_ratio']}x"
        f" ({summary['token_bytes']:,} token bytes -> {summary['stored_bytes']:,} stored)",
    ]
    if "trained_tokens" in summary:
        lines.append(
            f"  trained tokens  {summary['trained_tokens']:,} ({summary['trained_percent']}%)"
        )
    if "sft" in summary:
        lines.append(f"  sft             {json.dumps(summary['sft'], sort_keys=True)}")
    lengths = summary["document_length"]
    pct = "  ".join(f"p{p} {lengths[f'p{p}']:,}" for p in PERCENTILES)
    lines.append(f"  doc length      mean {lengths['mean']:,}  {pct}")
    if "manifests" in summary:
        lines.append(f"  manifests       {_manifests_line(summary['manifests'])}")
    extra = summary.get("extra") or {}
    if extra and "subset_of" in summary:  # convert's record counts every shard, not the subset
        lines.append("  of the whole dataset, as convert recorded it in index.json:")
    for key, value in sorted(extra.items()):
        text = value if isinstance(value, (int, float, str)) else json.dumps(value, sort_keys=True)
        text = str(text)
        lines.append(f"  {key:<15} {text if len(text) <= 100 else text[:97] + '...'}")
    return "\n".join(lines)
