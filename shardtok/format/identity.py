"""Is the shard that was opened the one the manifest lists at that place?

Token counts alone do not say so: two shards of equal size swapped, or a shard copied in from
another dataset of the same tokenizer, have the right counts and the wrong tokens. Every reader
that serves tokens of a dataset calls :func:`check_shard_identity` on the shard's head (json and
idx, already read and verified) before the first token, so the check costs no extra I/O.
"""

from __future__ import annotations

from shardtok.errors import CorruptShardError
from shardtok.format.manifest import MANIFEST_NAME, Manifest, ShardEntry
from shardtok.format.shard_meta import ShardMeta
from shardtok.format.tar import BLOCK


def check_shard_identity(
    meta: ShardMeta,
    entry: ShardEntry,
    manifest: Manifest,
    where: str,
    file_size: int | None = None,
) -> None:
    """Raise CorruptShardError unless `meta` is the shard `entry` of `manifest` describes.

    Every dataset: the key (which every member name carries) is the entry's file name without
    ``.tar``; counts, dtype, vocabulary and tokenizer equal the manifest's; with `file_size`,
    the file has the entry's byte size. Manifests from 0.2 on also record each shard json's
    meta_sha256, which covers the frame table, ``bin_sha256`` and ``idx_sha256``: a match ties
    the opened file to the exact tokens the dataset was written with."""

    def fail(what: str, manifest_says, shard_has) -> CorruptShardError:
        return CorruptShardError(
            where,
            meta.json_member,
            BLOCK,
            f"not the shard {MANIFEST_NAME} lists as {entry.file}: the manifest says {what} "
            f"{manifest_says!r}, the shard has {shard_has!r}",
        )

    if f"{meta.key}.tar" != entry.file:
        raise fail("the file name its key gives", entry.file, f"{meta.key}.tar")
    claims = (
        ("num_documents", entry.num_documents, meta.num_documents),
        ("num_tokens", entry.num_tokens, meta.num_tokens),
        ("dtype", manifest.dtype.name, meta.dtype.name),
        ("vocab_size", manifest.vocab_size, meta.vocab_size),
        ("tokenizer", manifest.tokenizer, meta.tokenizer),
    )
    trained = None if meta.mask is None else meta.mask.trained_tokens
    claims += (("trained_tokens", entry.trained_tokens, trained),)
    for what, manifest_says, shard_has in claims:
        if manifest_says != shard_has:
            raise fail(what, manifest_says, shard_has)
    if entry.meta_sha256 is not None and entry.meta_sha256 != meta.sha256:
        raise fail("meta_sha256", entry.meta_sha256, meta.sha256)
    if file_size is not None and file_size != entry.bytes:
        raise CorruptShardError(
            where,
            None,
            None,
            f"file is {file_size} bytes, {MANIFEST_NAME} lists {entry.file} with {entry.bytes}",
        )


__all__ = ["check_shard_identity"]
