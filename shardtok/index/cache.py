"""On-disk cache of GPT indices, so a restart (or every rank) memory-maps them instead of rebuilding.

Layout: ``<cache_dir>/gpt-<sha256>/`` holding ``document_index.npy``, ``sample_index.npy``,
``shuffle_index.npy``, ``checksums.json`` (crc32 of each ``.npy`` file, checked on every load:
a flipped bit would otherwise repeat one sample and drop another, silently) and ``inputs.json``
(the inputs in readable form, for humans only). A folder that fails its checks is rebuilt, with
a warning naming the file. The
sha256 covers a format version and every input that changes the arrays, including the bytes of
``sizes`` and ``documents``, so a stale folder can never be picked up for different data.

A folder is built under a temporary name and renamed into place, and a rename is atomic: readers
see either no folder or a complete one, and when two processes race, the loser discards its copy.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from shardtok._checksum import file_crc32
from shardtok.errors import CorruptShardError
from shardtok.index.gpt import GptIndices, build_gpt_indices

logger = logging.getLogger(__name__)

# Bump when the arrays for the same inputs change (new semantics, new dtypes) or the folder
# layout does. 2: checksums.json (folders of version 1 have none and are simply not used).
CACHE_FORMAT_VERSION = 2
CHECKSUMS_NAME = "checksums.json"

_ARRAY_NAMES = ("document_index", "sample_index", "shuffle_index")

_HASH_BLOCK = 1 << 22


def _options(
    seq_length: int,
    num_samples: int | None,
    seed: int,
    add_extra_token_to_sequence: bool,
    drop_last_partial_sequence: bool,
) -> dict[str, int | bool | None]:
    """The scalar inputs of build_gpt_indices, canonicalised (also written to inputs.json)."""
    return {
        "seq_length": int(seq_length),
        "num_samples": None if num_samples is None else int(num_samples),
        "seed": int(seed),
        "add_extra_token_to_sequence": bool(add_extra_token_to_sequence),
        "drop_last_partial_sequence": bool(drop_last_partial_sequence),
    }


def _key(
    sizes: np.ndarray,
    documents: np.ndarray | Sequence[int] | None,
    options: dict[str, int | bool | None],
) -> str:
    header = {"format": "shardtok-gpt-indices", "version": CACHE_FORMAT_VERSION, **options}
    digest = hashlib.sha256(json.dumps(header, sort_keys=True).encode())
    digest.update(b"\0sizes\0")
    _hash_integers(digest, np.asarray(sizes))
    if documents is not None:
        digest.update(b"\0documents\0")
        _hash_integers(digest, np.asarray(documents))
    return digest.hexdigest()


def _hash_integers(digest: hashlib._Hash, values: np.ndarray) -> None:
    """Feed ``values`` as little-endian int64 (the key depends on the values, not on how the
    caller stored them), a block at a time so a 100M-document corpus needs no 800 MB copy."""
    for start in range(0, values.shape[0], _HASH_BLOCK):
        block = values[start : start + _HASH_BLOCK]
        digest.update(np.ascontiguousarray(block, dtype="<i8").tobytes())


def gpt_indices_cache_key(
    sizes: np.ndarray,
    seq_length: int,
    num_samples: int | None,
    seed: int,
    documents: np.ndarray | Sequence[int] | None = None,
    add_extra_token_to_sequence: bool = True,
    drop_last_partial_sequence: bool = True,
) -> str:
    """The sha256 hex digest naming the cache folder for these inputs."""
    options = _options(
        seq_length, num_samples, seed, add_extra_token_to_sequence, drop_last_partial_sequence
    )
    return _key(sizes, documents, options)


def cached_gpt_indices(
    cache_dir: str | os.PathLike[str],
    sizes: np.ndarray,
    seq_length: int,
    num_samples: int | None,
    seed: int,
    documents: np.ndarray | Sequence[int] | None = None,
    add_extra_token_to_sequence: bool = True,
    drop_last_partial_sequence: bool = True,
) -> GptIndices:
    """:func:`~shardtok.index.gpt.build_gpt_indices`, stored under ``cache_dir`` on first use.

    Returns the three arrays memory-mapped read-only (``np.load(mmap_mode="r")``), on the first
    call as on every later one, so callers see the same types either way.
    """
    options = _options(
        seq_length, num_samples, seed, add_extra_token_to_sequence, drop_last_partial_sequence
    )
    cache_root = Path(cache_dir)
    folder = cache_root / f"gpt-{_key(sizes, documents, options)}"
    if folder.is_dir():
        try:
            return _load(folder)
        except CorruptShardError as damage:
            logger.warning("%s; rebuilding the GPT index cache", damage)
            _discard(cache_root, folder)
    if not folder.is_dir():
        indices = build_gpt_indices(
            sizes,
            seq_length,
            num_samples,
            seed,
            documents,
            add_extra_token_to_sequence=add_extra_token_to_sequence,
            drop_last_partial_sequence=drop_last_partial_sequence,
        )
        description = {
            **options,
            "num_documents_in_sizes": int(np.asarray(sizes).shape[0]),
            "documents": "all" if documents is None else f"{len(documents)} listed",
        }
        _publish(cache_root, folder, indices, description)
    return _load(folder)


def _publish(
    cache_root: Path, folder: Path, indices: GptIndices, description: Mapping[str, object]
) -> None:
    cache_root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=cache_root))
    try:
        checksums = {}
        for name, array in zip(_ARRAY_NAMES, indices, strict=True):
            with open(staging / f"{name}.npy", "wb") as handle:
                np.save(handle, array, allow_pickle=False)
                handle.flush()
                os.fsync(handle.fileno())
            checksums[f"{name}.npy"] = file_crc32(staging / f"{name}.npy")
        (staging / "inputs.json").write_text(json.dumps(description, indent=2) + "\n")
        # Written last: a folder with checksums.json has every array.
        (staging / CHECKSUMS_NAME).write_text(json.dumps(checksums, sort_keys=True) + "\n")
        try:
            os.rename(staging, folder)
        except OSError:
            if not folder.is_dir():
                raise
            # Another process published the same key first; its arrays are identical.
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _discard(cache_root: Path, folder: Path) -> None:
    """Move a damaged folder out of the way (atomically, so racing processes agree) and delete it."""
    trash = Path(tempfile.mkdtemp(prefix=f".{folder.name}.damaged.", dir=cache_root))
    with contextlib.suppress(OSError):  # another process moved it first
        os.rename(folder, trash / "old")
    shutil.rmtree(trash, ignore_errors=True)


def _check_sums(folder: Path) -> None:
    def fail(member: str, reason: str) -> CorruptShardError:
        return CorruptShardError(str(folder / member), None, None, reason)

    try:
        expected = json.loads((folder / CHECKSUMS_NAME).read_text())
    except (OSError, ValueError) as error:
        raise fail(CHECKSUMS_NAME, f"cannot be read ({error})") from None
    if not isinstance(expected, dict):
        raise fail(CHECKSUMS_NAME, "is not an object")
    for name in _ARRAY_NAMES:
        try:
            actual = file_crc32(folder / f"{name}.npy")
        except OSError as error:
            raise fail(f"{name}.npy", f"cannot be read ({error})") from None
        if expected.get(f"{name}.npy") != actual:
            raise fail(f"{name}.npy", "fails its crc32 check")


def _load(folder: Path) -> GptIndices:
    _check_sums(folder)
    arrays = []
    for name in _ARRAY_NAMES:
        path = folder / f"{name}.npy"
        try:
            arrays.append(np.load(path, mmap_mode="r", allow_pickle=False))
        except (OSError, ValueError) as error:
            raise CorruptShardError(
                str(folder),
                f"{name}.npy",
                None,
                f"cached index cannot be read ({error})",
            ) from error
    document_index, sample_index, shuffle_index = arrays
    if sample_index.ndim != 2 or sample_index.shape[1] != 2:
        raise CorruptShardError(
            str(folder),
            "sample_index.npy",
            None,
            f"shape {sample_index.shape} is not (n, 2)",
        )
    if shuffle_index.shape != (sample_index.shape[0] - 1,):
        raise CorruptShardError(
            str(folder),
            "shuffle_index.npy",
            None,
            f"{shuffle_index.shape[0]} entries for {sample_index.shape[0] - 1} samples",
        )
    return GptIndices(document_index, sample_index, shuffle_index)
