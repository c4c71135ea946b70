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
from shardtok.format.shard_groups import group_count, group_members
from shardtok.index.slices import slice_bounds
from shardtok.stream.options import PACKINGS

SHARD_ORDER_STREAM = 1  # rng stream tags keep independent draws apart


def concat_window_count(num_tokens: int, seq_len: int, stride: int | None = None) -> int:
    """How many windows concat packing cuts from `num_tokens` consecutive tokens."""
    window = seq_len + 1
    stride = window if stride is None else stride
    return 0 if num_tokens < window else (num_tokens - window) // stride + 1


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


class EpochPlan:
    """One epoch's plan. A worker asks for its own slice (``slice_for``), computed directly from
    the shard groups' token sums and the rows of the groups it touches; ``slices`` (every
    slice) and ``shard_order`` (every shard) are computed only when asked for."""

    def __init__(
        self, *, seed: int, epoch: int, world_size: int, num_workers: int, seq_len: int,
        batch_size: int, packing: str, stride: int, order: ShardOrder,
        overlong: str = "split", document_sizes: Callable[[int], np.ndarray] | None = None,
    ):  # fmt: skip
        self.seed, self.epoch = seed, epoch
        self.world_size, self.num_workers = world_size, num_workers
        self.seq_len, self.batch_size, self.packing, self.stride = (
            seq_len, batch_size, packing, stride,
        )  # fmt: skip
        self.overlong = overlong
        self.order = order
        self.total_tokens = order.total_tokens
        self._document_sizes = document_sizes
        self._slices: tuple[SlicePlan, ...] | None = None
        self._min_sequences: int | None = None

    @property
    def count(self) -> int:
        return self.world_size * self.num_workers

    @property
    def counts_overlong(self) -> bool:
        """Whether overlong documents change slices' sequence counts (then every slice's
        documents are counted, from the shards' idx, before the batches are known)."""
        return self.packing != "concat" and self.overlong != "split"

    @property
    def shard_order(self) -> tuple[int, ...]:
        return tuple(int(i) for i in self.order.shard_order())

    @property
    def slices(self) -> tuple[SlicePlan, ...]:
        if self._slices is None:
            self._slices = tuple(self.slice_at(s) for s in range(self.count))
        return self._slices

    def slice_at(self, index: int) -> SlicePlan:
        """Slice `index` (``rank * num_workers + worker``), computed on its own."""
        if self._slices is not None:
            return self._slices[index]
        total, count = self.total_tokens, self.count
        a, b = slice_bounds(index, total, count)
        pieces = self.order.pieces(a, b)
        long = (0, 0)
        if self.counts_overlong:
            window = self.seq_len + 1
            long = overlong_in(pieces, self._document_sizes, window, self.overlong)  # type: ignore[arg-type]
        n = sequence_count(b - a - long[1], self.packing, self.seq_len, self.stride)
        rank, worker = divmod(index, self.num_workers)
        return SlicePlan(index, rank, worker, a, b, pieces, n, *long)

    @property
    def min_sequences(self) -> int:
        """The sequences of the smallest slice: what every (rank, worker) yields this epoch,
        whatever the batch size (the rows of its batches)."""
        if self._min_sequences is None:
            if self.counts_overlong:
                self._min_sequences = min(s.num_sequences for s in self.slices)
            else:
                # Slices hold floor(T / S) or one token more, and a slice's sequence count only
                # grows with its tokens: the smallest slice decides, without cutting any slice.
                least = self.total_tokens // self.count
                self._min_sequences = sequence_count(least, self.packing, self.seq_len, self.stride)
        return self._min_sequences

    @property
    def batches_per_slice(self) -> int:
        return self.min_sequences // self.batch_size

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
        return self.slice_at(rank * self.num_workers + worker)

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
        out = {
            "seed": self.seed, "epoch": self.epoch, "world_size": self.world_size,
            "num_workers": self.num_workers, "seq_len": self.seq_len,
            "batch_size": self.batch_size, "packing": self.packing, "stride": self.stride,
            "shard_order": self.shard_order, "total_tokens": self.total_tokens,
            "slices": [asdict(s) for s in self.slices],
            "batches_per_slice": self.batches_per_slice, "overlong": self.overlong,
        }  # fmt: skip
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


class ShardOrder:
    """The epoch's order of a manifest's shards, as shard groups (``shard_groups``).

    Groups are permuted with ``default_rng((seed, epoch, SHARD_ORDER_STREAM)).permutation(B)``;
    up to GROUP_LIMIT shards each group is one shard and that is the whole order (what every
    earlier release planned). Beyond it, the shards of a group follow one another in ascending
    order of ``splitmix64(i ^ key)``, `key` the next uint64 the same generator draws. Positions
    in the epoch's token stream need only the B group sums, so a slice is cut from the rows of
    the groups it touches."""

    def __init__(self, manifest: Manifest, seed: int, epoch: int):
        self.manifest = manifest
        self.num_shards = n = len(manifest.shards)
        self.groups = group_count(n)
        self.group_order, self.key = _draw(n, seed, epoch)
        sums = manifest.group_tokens()[self.group_order]
        self.begins = np.zeros(self.groups + 1, dtype=np.int64)
        np.cumsum(sums, out=self.begins[1:])
        self.total_tokens = int(self.begins[-1])

    def members(self, group: int) -> np.ndarray:
        """Group `group`'s shards in this epoch's order."""
        idx = group_members(group, self.num_shards, self.groups)
        if len(idx) > 1:
            idx = idx[np.argsort(splitmix64(idx.astype(np.uint64) ^ self.key), kind="stable")]
        return idx

    def shard_order(self) -> np.ndarray:
        """Every shard in this epoch's order."""
        return _ordered(self.num_shards, self.group_order, self.key)

    def pieces(self, a: int, b: int) -> tuple[Piece, ...]:
        """The shards' token ranges that make up tokens [a, b) of the epoch's stream."""
        shards = self.manifest.shards
        table_load = getattr(shards, "load_groups", None)
        first = int(np.searchsorted(self.begins, a, side="right")) - 1
        last = int(np.searchsorted(self.begins, b, side="left"))  # groups first..last-1
        touched = self.group_order[max(first, 0) : last]
        if table_load is not None:  # a compact manifest: the groups' rows in few range reads
            table_load(touched.tolist())
        out = []
        for j in range(max(first, 0), last):
            at = int(self.begins[j])
            if at >= b:
                break
            for i in self.members(int(self.group_order[j])).tolist():
                size = shards[i].num_tokens
                lo, hi = max(a, at) - at, min(b, at + size) - at
                if hi > lo:
                    out.append(Piece(i, self.manifest.file_of(i), lo, hi))
                at += size
        return tuple(out)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser, elementwise on uint64 (wrapping arithmetic)."""
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _draw(num_shards: int, seed: int, epoch: int) -> tuple[np.ndarray, np.uint64 | None]:
    """The group permutation and, when groups hold several shards, the key ordering them."""
    rng = np.random.default_rng((seed, epoch, SHARD_ORDER_STREAM))
    groups = group_count(num_shards)
    order = rng.permutation(groups)
    if groups == num_shards:
        return order, None
    return order, np.uint64(rng.integers(0, 2**64, dtype=np.uint64, endpoint=False))


def _ordered(num_shards: int, group_order: np.ndarray, key: np.uint64 | None) -> np.ndarray:
    if key is None:
        return group_order
    groups = len(group_order)
    idx = np.arange(num_shards, dtype=np.int64)
    rank = np.empty(groups, dtype=np.int64)
    rank[group_order] = np.arange(groups)
    return idx[np.lexsort((splitmix64(idx.astype(np.uint64) ^ key), rank[idx % groups]))]


def shard_order(num_shards: int, seed: int, epoch: int) -> np.ndarray:
    """The epoch's shard permutation (it depends on the number of shards alone)."""
    return _ordered(num_shards, *_draw(num_shards, seed, epoch))


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
    counted = packing != "concat" and overlong != "split"
    if counted and document_sizes is None:
        raise ValueError(f"overlong={overlong!r} packing needs the shards' document sizes")
    return EpochPlan(
        seed=seed,
        epoch=epoch,
        world_size=world_size,
        num_workers=num_workers,
        seq_len=seq_len,
        batch_size=batch_size,
        packing=packing,
        stride=stride,
        order=ShardOrder(manifest, seed, epoch),
        overlong=overlong if packing != "concat" else "split",
        document_sizes=document_sizes,
    )
