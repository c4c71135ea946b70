"""The epoch plan: who reads which tokens, and how many batches everyone yields.

Computed from the manifest alone, before any shard is opened:

1. permute the shards with ``default_rng((seed, epoch, SHARD_ORDER_STREAM))``;
2. concatenate them in that order into one virtual stream of T tokens;
3. cut it into ``S = world_size * num_workers`` slices at token offsets ``s * T // S`` (sizes
   differ by at most one token); slice ``s = rank * num_workers + worker`` (rank-major, so a
   rank reads one contiguous stretch of the permuted stream). A slice is a list of pieces
   (shard, token range); a document cut by a slice boundary becomes two documents, so no token
   is lost or read twice, and fewer shards than slices works;
4. count the sequences each slice can make: concat, exactly ``(T_s - L) // stride + 1``
   (``L = seq_len + 1``); greedy and bfd, at least ``ceil(K_s / L)`` (a sequence holds at most L
   real tokens), where K_s = T_s unless documents longer than L are truncated or dropped
   (``overlong``): then the shards' document sizes (their idx) give the exact K_s, and the
   overlong documents and the tokens they lose are counted;
5. every slice yields exactly ``B = min_s(sequences_s // batch_size)`` batches, so every rank
   yields ``B * num_workers``. What is left of a slice is not read this epoch and is reported:
   for concat (stride L) fewer than ``(batch_size + 1) * L`` tokens per slice.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from shardtok.errors import UsageError
from shardtok.format.manifest import Manifest
from shardtok.index.slices import cut_ranges
from shardtok.stream.nodes.concat import concat_window_count
from shardtok.stream.options import PACKINGS

SHARD_ORDER_STREAM = 1  # rng stream tags keep independent draws apart


@dataclass(frozen=True)
class Piece:
    """Tokens ``[start, stop)`` of one shard (shard-local token offsets)."""

    shard: int  # index in the manifest
    file: str
    start: int
    stop: int

    @property
    def num_tokens(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class SlicePlan:
    index: int
    rank: int
    worker: int
    start: int  # virtual token range of the epoch stream
    stop: int
    pieces: tuple[Piece, ...]
    num_sequences: int  # exact for concat, a guaranteed lower bound for greedy and bfd
    overlong_documents: int = 0  # longer than seq_len + 1 (counted unless split)
    overlong_tokens: int = 0  # of those, tokens truncated or dropped

    @property
    def num_tokens(self) -> int:
        return self.stop - self.start

    @property
    def kept_tokens(self) -> int:
        return self.num_tokens - self.overlong_tokens


@dataclass(frozen=True)
class EpochPlan:
    seed: int
    epoch: int
    world_size: int
    num_workers: int
    seq_len: int
    batch_size: int
    packing: str
    stride: int
    shard_order: tuple[int, ...]
    total_tokens: int
    slices: tuple[SlicePlan, ...]
    batches_per_slice: int
    overlong: str = "split"

    @property
    def overlong_documents(self) -> int:
        return sum(s.overlong_documents for s in self.slices)

    @property
    def overlong_tokens(self) -> int:
        return sum(s.overlong_tokens for s in self.slices)

    @property
    def batches_per_rank(self) -> int:
        return self.batches_per_slice * self.num_workers

    @property
    def sequences_per_slice(self) -> int:
        return self.batches_per_slice * self.batch_size

    def slice_for(self, rank: int, worker: int) -> SlicePlan:
        if not (0 <= rank < self.world_size and 0 <= worker < self.num_workers):
            raise UsageError(
                f"rank {rank} / worker {worker} outside world_size {self.world_size} x "
                f"num_workers {self.num_workers}"
            )
        return self.slices[rank * self.num_workers + worker]

    def tokens_read(self, s: SlicePlan) -> int:
        """Tokens of slice `s` the packer reads this epoch (concat exact; greedy at most)."""
        n = self.sequences_per_slice
        window = self.seq_len + 1
        if n == 0:
            return 0
        if self.packing == "concat":
            return (n - 1) * self.stride + window
        return min(s.kept_tokens, n * window)

    @property
    def tokens_unread(self) -> int:
        """Concat: exactly the tokens no window covers. Greedy: a lower bound (padding adds
        more), overlong documents' truncated or dropped tokens included."""
        return sum(s.num_tokens - self.tokens_read(s) for s in self.slices)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["batches_per_rank"] = self.batches_per_rank
        out["tokens_unread"] = self.tokens_unread
        out["overlong_documents"] = self.overlong_documents
        out["overlong_tokens"] = self.overlong_tokens
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def _shard_names(self) -> list[str]:
        """The shard order as printed: positions in the manifest, which are the shard numbers of
        a whole dataset; for a subset, whose positions are not its files' numbers, the files."""
        files = {p.shard: p.file for s in self.slices for p in s.pieces}
        numbered = all(f.endswith(f"-{i:06d}.tar") for i, f in files.items())
        return [str(i) if numbered else files.get(i, f"#{i}") for i in self.shard_order]

    def summary(self) -> str:
        counts = [s.num_tokens for s in self.slices]
        seqs = [s.num_sequences for s in self.slices]
        pieces = [len(s.pieces) for s in self.slices]
        unread = self.tokens_unread
        exact = (
            "" if self.packing == "concat" else f" at least ({self.packing} padding reads fewer)"
        )
        order = ", ".join(self._shard_names()[:8]) + (", ..." if len(self.shard_order) > 8 else "")
        return "\n".join(
            [
                f"epoch {self.epoch} plan (seed {self.seed}): {len(self.shard_order)} shards, "
                f"{self.total_tokens:,} tokens, shard order [{order}]",
                f"  {len(self.slices)} slices = {self.world_size} ranks x {self.num_workers} workers "
                f"(rank-major); tokens per slice {min(counts):,}..{max(counts):,}; "
                f"pieces per slice {min(pieces)}..{max(pieces)}",
                f"  {self.packing} packing, seq_len {self.seq_len}, stride {self.stride}: "
                f"sequences per slice {min(seqs):,}..{max(seqs):,}"
                + (" (lower bound)" if self.packing != "concat" else ""),
                f"  batches of {self.batch_size}: {self.batches_per_slice:,} per worker, "
                f"{self.batches_per_rank:,} per rank, "
                f"{self.batches_per_rank * self.world_size:,} in all",
                f"  tokens left unread this epoch{exact}: {unread:,} "
                f"({100.0 * unread / max(self.total_tokens, 1):.4f}%)",
                *self._overlong_line(),
            ]
        )

    def _overlong_line(self) -> list[str]:
        if self.packing == "concat":
            return []
        if self.overlong == "split":
            return [f"  documents longer than {self.seq_len + 1} tokens: split into sequences"]
        return [
            f"  documents longer than {self.seq_len + 1} tokens ({self.overlong}): "
            f"{self.overlong_documents:,}, losing {self.overlong_tokens:,} tokens"
        ]


def shard_order(num_shards: int, seed: int, epoch: int) -> np.ndarray:
    """The epoch's shard permutation."""
    rng = np.random.default_rng((seed, epoch, SHARD_ORDER_STREAM))
    return rng.permutation(num_shards)


def cut_slices(segments: list[Piece], count: int) -> list[tuple[int, int, tuple[Piece, ...]]]:
    """Cut the concatenation of `segments` into `count` runs of (nearly) equal token counts.

    Returns (start, stop, pieces) per slice, start/stop in the virtual token stream.
    """
    out = []
    for a, b, parts in cut_ranges([p.num_tokens for p in segments], count):
        pieces = tuple(
            Piece(
                segments[j].shard, segments[j].file, segments[j].start + lo, segments[j].start + hi
            )
            for j, lo, hi in parts
        )
        out.append((a, b, pieces))
    return out


def overlong_in(
    pieces: tuple[Piece, ...], sizes: Callable[[int], np.ndarray], window: int, overlong: str
) -> tuple[int, int]:
    """(documents longer than `window`, tokens they lose to `overlong`) among the documents of
    `pieces` as the reader yields them (trimmed to each piece's token range)."""
    documents = lost = 0
    for piece in pieces:
        lengths = np.asarray(sizes(piece.shard), dtype=np.int64)
        ends = np.cumsum(lengths)
        begins = ends - lengths
        first = int(np.searchsorted(ends, piece.start, side="right"))
        last = int(np.searchsorted(begins, piece.stop, side="left"))
        trimmed = np.minimum(ends[first:last], piece.stop) - np.maximum(
            begins[first:last], piece.start
        )
        long = trimmed[trimmed > window]
        documents += len(long)
        lost += int(long.sum()) - (window * len(long) if overlong == "truncate" else 0)
    return documents, lost


def sequence_count(num_tokens: int, packing: str, seq_len: int, stride: int) -> int:
    if packing == "concat":
        return concat_window_count(num_tokens, seq_len, stride)
    return -(-num_tokens // (seq_len + 1))


def epoch_plan(
    manifest: Manifest,
    *,
    seq_len: int,
    batch_size: int,
    seed: int = 0,
    epoch: int = 0,
    world_size: int = 1,
    num_workers: int = 1,
    packing: str = "concat",
    stride: int | None = None,
    overlong: str = "split",
    document_sizes: Callable[[int], np.ndarray] | None = None,
) -> EpochPlan:
    """Plan one epoch for every (rank, worker). Reads nothing but the manifest, except
    `document_sizes(shard)` (the shard's idx sizes) when greedy or bfd truncate or drop
    overlong documents, which changes how many tokens are packed."""
    if packing not in PACKINGS:
        raise UsageError(f"packing must be one of {PACKINGS}, got {packing!r}")
    if world_size < 1 or num_workers < 1 or batch_size < 1 or seq_len < 1:
        raise UsageError("world_size, num_workers, batch_size and seq_len must be positive")
    if seed < 0 or epoch < 0:
        raise UsageError("seed and epoch must be non-negative integers")
    window = seq_len + 1
    stride = window if stride is None else int(stride)
    if packing == "concat" and not 1 <= stride <= window:
        raise UsageError(f"stride must lie in [1, seq_len + 1 = {window}], got {stride}")
    if packing != "concat":  # padded packings read every token once
        stride = window
    order = shard_order(len(manifest.shards), seed, epoch)
    segments = [
        Piece(int(i), manifest.shards[i].file, 0, manifest.shards[i].num_tokens) for i in order
    ]
    count = world_size * num_workers
    slices = []
    counted = packing != "concat" and overlong != "split"
    if counted and document_sizes is None:
        raise ValueError(f"overlong={overlong!r} packing needs the shards' document sizes")
    for s, (a, b, pieces) in enumerate(cut_slices(segments, count)):
        rank, worker = divmod(s, num_workers)
        long = overlong_in(pieces, document_sizes, window, overlong) if counted else (0, 0)  # type: ignore[arg-type]
        n = sequence_count(b - a - long[1], packing, seq_len, stride)
        slices.append(SlicePlan(s, rank, worker, a, b, pieces, n, *long))
    batches = min(s.num_sequences for s in slices) // batch_size
    return EpochPlan(
        seed=seed,
        epoch=epoch,
        world_size=world_size,
        num_workers=num_workers,
        seq_len=seq_len,
        batch_size=batch_size,
        packing=packing,
        stride=stride,
        shard_order=tuple(int(i) for i in order),
        total_tokens=manifest.num_tokens,
        slices=tuple(slices),
        batches_per_slice=batches,
        overlong=overlong if packing != "concat" else "split",
    )
