"""Turning packed sequences into a training batch (vectorized over the whole batch).

A batch is a dict of numpy arrays, for ``B`` sequences of ``S = seq_len`` inputs:

==================  ============  ======================================================
``input_ids``       int64 [B, S]  ``tokens[:, :-1]``
``labels``          int64 [B, S]  ``labels_format="shifted"``: ``tokens[:, 1:]``, the target
                                  of ``input_ids[:, i]`` at ``i``; -100 where the target is
                                  padding, where its loss mask is 0 (fine-tuning data) and
                                  where the target is the first token of another document:
                                  always for rows of masked data, else with
                                  ``mask_boundary_labels``.
                                  ``labels_format="hf"``: the same labels moved one to the
                                  right (aligned with ``input_ids``, -100 in column 0), for
                                  models that shift internally; each row's last target
                                  (``tokens[:, -1]``) cannot be expressed and is dropped
``position_ids``    int64 [B, S]  restart at 0 at every document segment
``document_ids``    int32 [B, S]  segment number within the row (0, 1, ...); padding is a
                                  segment of its own. ``document_ids[b, i] == document_ids[b,
                                  j]`` with ``j <= i`` is the block-causal mask
``cu_seqlens``      int32 [n+1]   FlashAttention varlen boundaries over the flattened batch
                                  (``B * S`` tokens, one entry per segment plus the end)
``max_seqlen``      int           longest segment, for varlen kernels
``num_trained_tokens`` int        labels that are not -100 (what a loss is averaged over)
``source_ids``      int64 [B]     per sequence, the source it was packed from: 0 for one
                                  dataset (and the memmap path), a mix's source index, a
                                  curriculum's source number (``Curriculum.sources``)
==================  ============  ======================================================

Data without loss masks counts as all trained; its batches are built without any mask array.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from shardtok.errors import UsageError
from shardtok.stream.masked import IGNORE_INDEX, flag_untrained
from shardtok.stream.masked_rows import masked_rows as _masked_rows
from shardtok.stream.segments import contiguous_segments, fill_segments
from shardtok.stream.sequence import PackedSequence

try:  # compiled at install where a C compiler is found (pyproject.toml: optional)
    from shardtok.stream._rows import contiguous as _contiguous_kernel
except ImportError:  # pragma: no cover - a build without a compiler: contiguous_rows_numpy
    _contiguous_kernel = None

LABELS_FORMATS = ("shifted", "hf")
BATCH_KEYS = ("input_ids", "labels", "position_ids", "document_ids", "cu_seqlens", "source_ids")
SCALAR_KEYS = ("max_seqlen", "num_trained_tokens")  # plain ints, for the whole batch

# Allocator for the output arrays: given (batch_size, seq_len) it returns writable arrays for
# every key in BATCH_KEYS (cu_seqlens with room for batch_size * seq_len + 1 entries,
# source_ids [batch_size]). The torch adapter passes one that hands out shared-memory slots,
# so batches are built in place (source_ids too: no per-batch pickling).
Allocator = Callable[[int, int], dict[str, np.ndarray]]


def allocate_arrays(batch_size: int, seq_len: int) -> dict[str, np.ndarray]:
    """A batch's arrays, uninitialized, as views of one block of memory.

    One block, not one allocation per array: freeing a batch's separate arrays (three of
    128 KiB at 8 x 2048) could leave enough free memory at the top of the heap for glibc to
    hand it back to the kernel, and the next batch then faulted its pages in again, zeroed
    (97-865 page faults and 0.2-1.2 ms a batch at 16 x 2048 to 32 x 4096 in one process,
    depending on the shape and on whether the caller let go of the last batch first;
    benchmarks/bench_batch_assembly.py). A block of the whole batch stays below the trim
    threshold glibc raises to its size once the first one is freed. Slices of one int64
    block cost 0.8 µs more than separate arrays; views through ``np.ndarray(buffer=...)`` 1.7.
    """
    n = batch_size * seq_len
    block = np.empty(3 * n + (2 * n + 2) // 2 + batch_size, dtype=np.int64)
    small = block[3 * n : 3 * n + (2 * n + 2) // 2].view(np.int32)  # >= 2n + 1 int32 items
    shape = (batch_size, seq_len)
    return {
        "input_ids": block[:n].reshape(shape),
        "labels": block[n : 2 * n].reshape(shape),
        "position_ids": block[2 * n : 3 * n].reshape(shape),
        "document_ids": small[:n].reshape(shape),
        "cu_seqlens": small[n : 2 * n + 1],
        "source_ids": block[len(block) - batch_size :],
    }


def to_hf_labels(labels: np.ndarray) -> np.ndarray:
    """Turn shifted `labels` [B, S] into Hugging Face's layout, in place, and return them.

    A ``*ForCausalLM`` scores ``logits[:, i]`` against ``labels[:, i + 1]``, so the target of
    input ``i`` moves to column ``i + 1``; column 0 (no input before it) becomes -100 and the
    target of the last input falls off. Every -100 moves with its target, so any mask applied
    to the shifted labels (boundaries, padding, a per-token loss mask) carries over as is.
    """
    # numpy buffers overlapping slice assignments, so the shift is safe in place.
    labels[:, 1:] = labels[:, :-1]
    labels[:, 0] = IGNORE_INDEX
    return labels


def check_labels_format(labels_format: object) -> None:
    """The one check of a labels format, for the options, the memmap dataset and the batch
    functions alike (a UsageError, which is also a ValueError)."""
    if labels_format not in LABELS_FORMATS:
        raise UsageError(f"labels_format must be one of {LABELS_FORMATS}, got {labels_format!r}")


def _fill_labels(
    labels: np.ndarray,
    grid: np.ndarray,
    ignored: list[int],
    labels_format: str,
    padded: Sequence[tuple[int, int]] = (),
) -> None:
    """Write the labels of (unflagged) token rows `grid` [B, S + 1] into `labels` [B, S], with
    -100 at the flat shifted positions `ignored` and at the targets from column `c` of `grid`
    on in each `padded` row ``(b, c)``; the result equals `to_hf_labels` of the shifted labels.

    The hf labels are copied straight from the tokens and the ignored positions moved one
    column instead of shifting the finished labels: an overlapping in-place shift goes
    through a temporary buffer and cost a third of the whole batch assembly. Padding is a
    slice per row, not a list of positions (numpy converts such a list element by element).
    """
    if labels_format == "shifted":
        np.copyto(labels, grid[:, 1:], casting="unsafe")
        if ignored:
            labels.reshape(-1)[ignored] = IGNORE_INDEX
        for b, column in padded:
            labels[b, column - 1 :] = IGNORE_INDEX
        return
    seq_len = labels.shape[1]
    np.copyto(labels[:, 1:], grid[:, 1:-1], casting="unsafe")
    labels[:, 0] = IGNORE_INDEX
    if ignored:
        flat = np.asarray(ignored, dtype=np.int64)
        # A masked last column is the dropped target; it has no hf column to mask.
        flat = flat[flat % seq_len != seq_len - 1]
        labels.reshape(-1)[flat + 1] = IGNORE_INDEX
    for b, column in padded:
        labels[b, column:] = IGNORE_INDEX


def build_batch(
    sequences: Sequence[PackedSequence],
    *,
    mask_boundary_labels: bool = False,
    labels_format: str = "shifted",
    allocate: Allocator = allocate_arrays,
) -> dict:
    """Stack sequences (all ``seq_len + 1`` tokens) into the batch described above. Sequences
    with a mask are fine-tuning rows; in a batch that has any, the others count as all trained
    and keep `mask_boundary_labels`."""
    sft_rows = [seq.mask is not None for seq in sequences]
    tokens = np.stack(
        [flag_untrained(s.tokens, s.mask) if s.mask is not None else s.tokens for s in sequences]
    )
    return assemble_batch(
        tokens,
        [seq.starts for seq in sequences],
        [seq.length for seq in sequences],
        mask_boundary_labels=mask_boundary_labels,
        labels_format=labels_format,
        allocate=allocate,
        masked=any(sft_rows),
        sft_rows=sft_rows,
    )


def assemble_batch(
    tokens: np.ndarray,
    starts: Sequence[Sequence[int]],
    lengths: Sequence[int],
    *,
    mask_boundary_labels: bool = False,
    labels_format: str = "shifted",
    allocate: Allocator = allocate_arrays,
    masked: bool = False,
    sft_rows: Sequence[bool] | None = None,
    source_ids: Sequence[int] | np.ndarray | None = None,
) -> dict:
    """The batch of rows `tokens` [B, seq_len + 1], whose segments begin at `starts` and whose
    first `lengths` tokens are real (the rest padding). `masked`: the tokens carry loss masks
    as flag bits (``stream.masked``); the rows of masked data (`sft_rows`, default all) never
    train a label across a document boundary, the others keep `mask_boundary_labels`.
    `source_ids`: each row's source (default: all 0).

    Work is per segment, not per token: a handful of numpy calls over the whole batch.
    """
    check_labels_format(labels_format)
    rows, window = tokens.shape
    seq_len = window - 1
    out = allocate(rows, seq_len)
    input_ids, labels = out["input_ids"], out["labels"]
    seg_starts: list[int] = []  # flat (row * seq_len + column) start of every input segment
    local_ids: list[int] = []  # segment number within its row
    # Labels to set to IGNORE_INDEX: targets that begin a document by flat position, in the
    # labels or for flagged tokens (whose labels are made on the token rows) in `tokens`; a
    # padded row's tail as one slice (`padded`: the row, its first padding target's column).
    ignored: list[int] = []
    padded: list[tuple[int, int]] = []
    for b in range(rows):
        row = b * seq_len
        label0 = b * window + 1 if masked else row  # where label 0 of the row is counted
        length = lengths[b]
        boundary = mask_boundary_labels or (masked and (sft_rows is None or sft_rows[b]))
        n = 0
        for column in starts[b]:
            if column < seq_len:
                seg_starts.append(row + column)
                n += 1
            if boundary and column > 0:
                ignored.append(label0 + column - 1)
        if length < window:
            if length < seq_len:
                seg_starts.append(row + length)  # padding is a segment of its own
                n += 1
            padded.append((b, max(length, 1)))
        local_ids.extend(range(n))
    if masked:
        trained = _masked_rows(input_ids, labels, tokens, ignored, labels_format, padded)
    else:
        _copy_inputs(input_ids, tokens)
        _fill_labels(labels, tokens, ignored, labels_format, padded)
        trained = _trained(labels, ignored, labels_format, padded)
    longest = fill_segments(
        seg_starts, local_ids, out["position_ids"], out["document_ids"], out["cu_seqlens"]
    )
    batch = _batch(out, len(seg_starts), longest)
    batch["num_trained_tokens"] = trained
    batch["source_ids"] = _source_ids(out, rows, 0 if source_ids is None else source_ids)
    return batch


def _source_ids(out: dict, rows: int, values) -> np.ndarray:
    """`values` in the allocated source_ids (an allocator without them: a fresh array, never
    a shared one, since a tensor viewing it may be written by its user)."""
    ids = out.get("source_ids")
    if ids is None:
        ids = np.empty(rows, dtype=np.int64)
    ids[:] = values
    return ids


def _copy_inputs(input_ids: np.ndarray, grid: np.ndarray) -> None:
    np.copyto(input_ids, grid[:, :-1], casting="unsafe")


def _trained(
    labels: np.ndarray,
    ignored: list[int],
    labels_format: str,
    padded: Sequence[tuple[int, int]] = (),
) -> int:
    """How many labels of unflagged tokens are not -100 (`_fill_labels`'s arguments): it
    follows from the ignored positions (distinct by construction), without a pass over the
    labels."""
    rows, seq_len = labels.shape
    if labels_format == "shifted":
        return rows * seq_len - len(ignored) - sum(seq_len + 1 - c for _, c in padded)
    # hf: column 0 is never trained and each row's last shifted target is dropped.
    last = seq_len - 1
    ignored_hf = sum(1 for p in ignored if p % seq_len != last)
    return rows * last - ignored_hf - sum(seq_len - c for _, c in padded)


def _batch(out: dict, segments: int, longest: int) -> dict:
    """The batch dict of `out` once its arrays are written: `segments` of them (cu_seqlens is
    cut to its used part), the longest `longest` tokens."""
    return {
        "input_ids": out["input_ids"],
        "labels": out["labels"],
        "position_ids": out["position_ids"],
        "document_ids": out["document_ids"],
        "cu_seqlens": out["cu_seqlens"][: segments + 1],
        "max_seqlen": longest,
    }


def assemble_contiguous_batch(
    tokens: np.ndarray | list[np.ndarray],
    boundaries: Sequence[int],
    rows: int,
    *,
    mask_boundary_labels: bool = False,
    labels_format: str = "shifted",
    allocate: Allocator = allocate_arrays,
    masked: bool = False,
) -> dict:
    """The batch whose rows are consecutive runs of one token stream: row ``b`` is
    ``tokens[b * W : (b + 1) * W]`` (``W = seq_len + 1``, no padding) and documents begin at
    the flat positions `boundaries` (ints, ascending, in ``(0, len(tokens))``) besides every
    row start. `tokens` is one array, or a list of 1-D arrays that are the run end to end (the
    pieces of the documents it is cut from, as the concat packer hands them over: read where
    they lie, never concatenated, where the compiled pass was built). `masked`: the tokens are
    one masked dataset's, with loss masks as flag bits (``stream.masked``); its labels never
    cross a document boundary.

    Equal to `assemble_batch` on the same rows and starts. Inputs and labels come from one
    compiled pass over the pieces (``_rows.c``'s ``contiguous``), or from its twin,
    `contiguous_rows_numpy`; the segments from the boundaries in one more
    (``segments.contiguous_segments``).
    """
    check_labels_format(labels_format)
    pieces = tokens if isinstance(tokens, list) else [tokens]
    if not isinstance(boundaries, list):  # both kernels read a list (of ints or numpy's)
        boundaries = list(boundaries)
    window = sum(map(len, pieces)) // rows
    seq_len = window - 1
    out = allocate(rows, seq_len)
    input_ids, labels = out["input_ids"], out["labels"]
    # The target before a document's first token is that token: unpredictable. By flat
    # position in the run; a document starting a row has no target before it in that row
    # (the kernel passes over those itself).
    starts = boundaries if masked or mask_boundary_labels else []
    trained = None
    if (
        _contiguous_kernel is not None
        and input_ids.flags.c_contiguous
        and labels.flags.c_contiguous
    ):
        untrained = _contiguous_kernel(
            pieces, input_ids, labels, labels_format == "hf", masked, starts
        )
        if untrained is not None:  # None: pieces the kernel does not read (the twin does)
            trained = labels.size - (rows if labels_format == "hf" else 0) - untrained
    if trained is None:
        starts = [p for p in starts if p % window]
        trained = contiguous_rows_numpy(pieces, input_ids, labels, starts, labels_format, masked)
    count, longest = contiguous_segments(
        boundaries, rows, out["position_ids"], out["document_ids"], out["cu_seqlens"]
    )
    batch = _batch(out, count, longest)
    batch["num_trained_tokens"] = trained
    batch["source_ids"] = _source_ids(out, rows, 0)  # one token stream: one source
    return batch


def contiguous_rows_numpy(
    pieces: list[np.ndarray],
    input_ids: np.ndarray,
    labels: np.ndarray,
    starts: list[int],
    labels_format: str,
    masked: bool,
) -> int:
    """The inputs and labels of the run `pieces` [B * W] into `input_ids` and `labels` [B, S]
    with -100 at the targets of the flat run positions `starts`, and the trained count: the
    compiled ``contiguous``'s twin (one concatenation, then the grid's copies or, masked,
    ``masked_rows``)."""
    rows = len(input_ids)
    run = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
    grid = run.reshape(rows, -1)
    if masked:
        return _masked_rows(input_ids, labels, grid, starts, labels_format)
    window = grid.shape[1]
    ignored = [p - p // window - 1 for p in starts]  # run positions -> label positions
    _copy_inputs(input_ids, grid)
    _fill_labels(labels, grid, ignored, labels_format)
    return _trained(labels, ignored, labels_format)
