"""Megatron MMIDIDX version 1 index: encode and decode, byte-identical to megatron-core.

Layout (all little-endian)::

    b"MMIDIDX\\x00\\x00"           9 bytes magic
    <Q version = 1                8 bytes
    <B dtype code                 1 byte   (8 = uint16, 4 = int32, ...)
    <Q sequence count N           8 bytes
    <Q document count D + 1       8 bytes
    int32  sizes[N]               tokens per sequence
    int64  pointers[N]            byte offset of each sequence in the .bin
    int64  document_indices[D+1]  sequence index where each document starts, then N

shardtok writes one sequence per document, so ``document_indices == arange(N + 1)``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from shardtok.errors import CorruptShardError

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER_SIZE = len(MAGIC) + 8 + 1 + 8 + 8  # 34

# Megatron's DType codes. Fairseq's uint32 (code 9) is deliberately absent: Megatron cannot read it.
DTYPE_CODES: dict[np.dtype, int] = {
    np.dtype(np.uint8): 1,
    np.dtype(np.int8): 2,
    np.dtype(np.int16): 3,
    np.dtype(np.int32): 4,
    np.dtype(np.int64): 5,
    np.dtype(np.float64): 6,
    np.dtype(np.float32): 7,
    np.dtype(np.uint16): 8,
}
CODE_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}
TOKEN_DTYPES = (np.dtype(np.uint16), np.dtype(np.int32))

# The issue contract: uint16 when the vocabulary has at most this many ids. (Megatron's own
# DType.optimal_dtype uses "< 65500"; the two agree everywhere except at exactly 65500.)
UINT16_MAX_VOCAB = 65500


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """The token dtype for a vocabulary: uint16 up to 65500 ids, else int32."""
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    if vocab_size <= UINT16_MAX_VOCAB:
        return np.dtype(np.uint16)
    if vocab_size <= np.iinfo(np.int32).max:
        return np.dtype(np.int32)
    raise ValueError(f"vocab_size {vocab_size} does not fit int32 token ids")


def token_dtype(name_or_dtype: str | np.dtype | type) -> np.dtype:
    """Validate and normalise a token dtype (uint16 or int32)."""
    dtype = np.dtype(name_or_dtype)
    if dtype not in TOKEN_DTYPES:
        raise ValueError(f"token dtype must be uint16 or int32, got {dtype}")
    return dtype


@dataclass(frozen=True)
class MMIndex:
    """A decoded .idx: token dtype and the three arrays."""

    dtype: np.dtype
    sizes: np.ndarray  # int32[N]
    pointers: np.ndarray  # int64[N], byte offsets
    doc_idx: np.ndarray  # int64[D + 1]

    @property
    def num_sequences(self) -> int:
        return int(self.sizes.shape[0])

    @property
    def bin_nbytes(self) -> int:
        """Size the matching .bin must have."""
        return int(self.sizes.astype(np.int64).sum()) * self.dtype.itemsize


def idx_nbytes(num_documents: int) -> int:
    """Size of the index shardtok writes for `num_documents` (one sequence per document)."""
    return HEADER_SIZE + 12 * num_documents + 8 * (num_documents + 1)


def pointers_for(sizes: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Byte offset of each sequence: the exclusive prefix sum of sizes * itemsize."""
    pointers = np.zeros(len(sizes), dtype=np.int64)
    if len(sizes) > 1:
        np.cumsum(np.asarray(sizes[:-1], dtype=np.int64) * dtype.itemsize, out=pointers[1:])
    return pointers


def encode_idx(sizes: np.ndarray, dtype: np.dtype, doc_idx: np.ndarray | None = None) -> bytes:
    """Encode an index exactly as megatron-core's IndexedDatasetBuilder writes it."""
    dtype = np.dtype(dtype)
    sizes = np.asarray(sizes)
    if sizes.ndim != 1:
        raise ValueError("sizes must be 1-D")
    if len(sizes) and (sizes.min() < 0 or sizes.max() > np.iinfo(np.int32).max):
        raise ValueError("document sizes must be in [0, 2**31)")
    if doc_idx is None:
        doc_idx = np.arange(len(sizes) + 1, dtype=np.int64)
    header = MAGIC + struct.pack("<Q", VERSION) + struct.pack("<B", DTYPE_CODES[dtype])
    header += struct.pack("<Q", len(sizes)) + struct.pack("<Q", len(doc_idx))
    return b"".join(
        (
            header,
            sizes.astype(np.int32).tobytes(order="C"),
            pointers_for(sizes, dtype).tobytes(order="C"),
            np.asarray(doc_idx, dtype=np.int64).tobytes(order="C"),
        )
    )


def decode_idx(
    buf: bytes | memoryview | np.ndarray, where: str, member: str | None = None
) -> MMIndex:
    """Decode and validate an index; any inconsistency raises CorruptShardError naming `where`.

    Arrays are views into `buf` (zero-copy for a memmap).
    """

    def fail(offset: int, reason: str) -> CorruptShardError:
        return CorruptShardError(where, member, offset, reason)

    view = memoryview(buf).cast("B")
    if len(view) < HEADER_SIZE:
        raise fail(
            len(view), f"index is {len(view)} bytes, shorter than its {HEADER_SIZE}-byte header"
        )
    if bytes(view[:9]) != MAGIC:
        raise fail(
            0, f"bad magic: the first 9 bytes are not {MAGIC!r} (not a Megatron MMIDIDX index)"
        )
    (version,) = struct.unpack_from("<Q", view, 9)
    if version != VERSION:
        raise fail(9, f"unsupported index version {version}, expected {VERSION}")
    (code,) = struct.unpack_from("<B", view, 17)
    if code not in CODE_DTYPES:
        raise fail(17, f"unknown dtype code {code}")
    dtype = CODE_DTYPES[code]
    n, d = struct.unpack_from("<QQ", view, 18)
    expected = HEADER_SIZE + 4 * n + 8 * n + 8 * d
    # Megatron appends int8 sequence modes for multimodal datasets; we neither write nor accept them.
    if len(view) != expected:
        raise fail(
            len(view),
            f"index has {len(view)} bytes, header promises {expected} ({n} sequences, {d} document indices)",
        )
    sizes = np.frombuffer(view, dtype=np.int32, count=n, offset=HEADER_SIZE)
    pointers = np.frombuffer(view, dtype=np.int64, count=n, offset=HEADER_SIZE + 4 * n)
    doc_idx = np.frombuffer(view, dtype=np.int64, count=d, offset=HEADER_SIZE + 12 * n)
    index = MMIndex(dtype, sizes, pointers, doc_idx)
    _check_consistent(index, fail)
    return index


def _check_consistent(index: MMIndex, fail) -> None:
    n = index.num_sequences
    if n and index.sizes.min() < 0:
        raise fail(HEADER_SIZE + 4 * int(np.argmin(index.sizes)), "negative sequence size")
    if not np.array_equal(index.pointers, pointers_for(index.sizes, index.dtype)):
        bad = int(np.flatnonzero(index.pointers != pointers_for(index.sizes, index.dtype))[0])
        raise fail(
            HEADER_SIZE + 4 * n + 8 * bad, f"pointer {bad} disagrees with the sizes before it"
        )
    doc_idx = index.doc_idx
    doc_off = HEADER_SIZE + 12 * n
    if len(doc_idx) == 0 or doc_idx[0] != 0:
        raise fail(doc_off, "document indices must start at 0")
    if doc_idx[-1] != n:
        raise fail(
            doc_off + 8 * (len(doc_idx) - 1),
            f"last document index {doc_idx[-1]} != sequence count {n}",
        )
    if len(doc_idx) > 1 and np.any(np.diff(doc_idx) < 0):
        raise fail(doc_off, "document indices are not non-decreasing")
