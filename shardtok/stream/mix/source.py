"""One source of a mix: its packed sequences for one (rank, worker), epoch after epoch.

A source is an endless sequence of its epochs with one cursor (docs/STREAMING.md, "One model"):
each epoch's slice for this (rank, worker) is planned from the source's own seed, read and
packed; when it runs out the next epoch opens in place. A mix draws from several
(``mix/sequences.py``); curriculum stages keep their cursors across switches (``mix/cursors.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from shardtok.dataset.source import DatasetSource
from shardtok.errors import ResumeStateError, ShardtokError
from shardtok.stream import state as envelope
from shardtok.stream.build import document_stream, packer_for, plan_for
from shardtok.stream.mix.window import same_window, saved_window, window_of, with_window
from shardtok.stream.nodes.packer import Packer, packed_sequence
from shardtok.stream.options import StreamOptions
from shardtok.stream.remainder import RemainderDocuments
from shardtok.stream.sequence import PackedSequence

MIX_SEED_STREAM = 3  # rng stream tag: per-source seeds derived from the mix seed
_WHOLE = ((0, 0, sys.maxsize),)  # a repacked phase's documents: the whole residual


def source_seed(seed: int, index: int) -> int:
    """Source `index`'s own seed, so two sources never share shard orders or shuffle keys."""
    return int(np.random.default_rng((seed, MIX_SEED_STREAM, index)).integers(2**62))


class SourceSequences(Packer):
    """One source's packed sequences for one (rank, worker), epoch after epoch, without end.

    State: the source epoch, the packer's state inside it, sequences served so far and the
    window (``seq_len``, ``stride``) the packer state was packed with (absent in states before
    0.4: this stream's). Restored into another window (a curriculum stage with its own
    ``seq_len``), the source first packs the rest of the phase it was in (the tokens of no
    yielded sequence: the remainder rule's residual, ``stream/remainder.py``) with the new
    window, then its next epoch. The interrupted phases are kept as ``repack`` (``_repacked``).
    """

    KIND = "source_sequences"
    FIELDS = {
        "epoch": envelope.INT,
        "sequences": envelope.INT,
        "epoch_real_tokens": envelope.INT,
        "remainder": envelope.BOOL,
        "packer": envelope.STATE,
        "window": envelope.OBJECT,
        "repack": envelope.OBJECT,
    }
    OPTIONAL = ("window", "repack")

    def __init__(
        self,
        source: DatasetSource,
        options: StreamOptions,
        *,
        rank: int,
        world_size: int,
        worker: int,
        num_workers: int,
        first_epoch: int = 0,
        remainder: Callable[[StreamOptions], Packer] | None = None,
    ):
        super().__init__()
        # With `remainder` (elastic resume) the stream first packs the rest of the old layout's
        # source epochs (with the options it is given), then continues with epoch
        # `first_epoch` in this layout.
        self.remainder = remainder
        self.in_remainder = remainder is not None
        self.repack: dict | None = None  # the phases a window change interrupted
        self.epoch_real_tokens = 0  # real tokens served in the current epoch (or remainder)
        self.source = source
        self.options = options
        self.masked = source.manifest.masked
        self._overlong = {"documents": 0, "dropped": 0}  # of the epochs already finished
        self.rank, self.world_size = rank, world_size
        self.worker, self.num_workers = worker, num_workers
        self.first_epoch = first_epoch
        self.window = options.seq_len + 1
        self.epoch = first_epoch
        self.sequences = 0
        self._packer: Packer | None = None
        self._switching = False  # restoring a parked position (``continue_from``)

    def _open(self, epoch: int, options: StreamOptions | None = None) -> Packer:
        options = options or self.options
        plan = plan_for(
            self.source,
            options,
            epoch=epoch,
            world_size=self.world_size,
            num_workers=self.num_workers,
        )
        slice_plan = plan.slice_for(self.rank, self.worker)
        if slice_plan.num_sequences == 0:
            raise ShardtokError(
                f"{self.source.display}: slice {slice_plan.index} of epoch {epoch} holds "
                f"{slice_plan.num_tokens:,} tokens, too few for one "
                f"{options.seq_len + 1}-token sequence; this source is too small for this many "
                "ranks x workers"
            )
        return packer_for(
            document_stream(self.source, slice_plan, options, epoch), options, self.masked
        )

    def _packer_for_phase(self) -> Packer:
        if self.repack is not None:
            return self._repacked(self.repack)
        if self.in_remainder:
            assert self.remainder is not None
            return self.remainder(self.options)
        return self._open(self.epoch)

    def _repacked(self, repack: dict) -> Packer:
        """A fresh packer of this window over what the interrupted phases left: the base phase
        (``"epoch"``: the slice of epoch ``epoch - 1``; ``"elastic"``: the elastic remainder)
        packed with the first saved window, each later phase over the residual of the one
        before it at its switch, and this window over the last one's."""
        windows = [with_window(self.options, saved_window(w)) for w in repack["windows"]]
        if repack["base"] == "elastic":
            assert self.remainder is not None
            packer = self.remainder(windows[0])
        else:
            packer = self._open(self.epoch - 1, windows[0])
        overlong = self.options.overlong_for(self.masked)
        for saved, after in zip(repack["windows"], [*windows[1:], self.options], strict=True):
            residual, documents = type(packer).residual_documents, packer.upstream

            def rest(_: int, state=saved["packer"], docs=documents, residual=residual):
                return residual(state, docs, overlong)

            packer = packer_for(RemainderDocuments(rest, _WHOLE), after, self.masked)
        return packer

    def _reset(self, state: dict | None) -> None:
        if state is None:
            self.epoch, self.sequences, self.epoch_real_tokens = self.first_epoch, 0, 0
            self.in_remainder, self.repack = self.remainder is not None, None
            self._packer = self._packer_for_phase()
            self._packer.reset(None)
            return
        state = self.parse_state(state)
        self.epoch, self.sequences = state["epoch"], state["sequences"]
        self.epoch_real_tokens = state["epoch_real_tokens"]
        self.in_remainder = state["remainder"]
        self.repack = self._check_repack(state.get("repack"))
        if self.in_remainder and self.remainder is None and self.repack is None:
            raise ResumeStateError(
                "source_sequences state: field 'remainder' is true, but this stream has no "
                "elastic remainder"
            )
        saved = state.get("window")
        if saved is None or same_window(with_window(self.options, saved), self.options):
            self._packer = self._packer_for_phase()
            self._packer.reset(state["packer"])
            return
        if not self._switching:
            raise ResumeStateError(
                f"source_sequences state: packed {saved['seq_len']}-token rows, this stream "
                f"packs {self.options.seq_len}-token rows (only a stage switch changes them)"
            )
        # Another window: the rest of the current phase, packed with this one.
        if self.repack is None:
            base = "elastic" if self.in_remainder else "epoch"
            self.repack = {"base": base, "windows": []}
            if base == "epoch":
                self.epoch += 1  # a remainder phase carries the epoch that follows it
        self.repack["windows"].append({**saved, "packer": state["packer"]})
        self.in_remainder, self.epoch_real_tokens = True, 0
        self._packer = self._packer_for_phase()
        self._packer.reset(None)

    def continue_from(self, state: dict) -> None:
        """Restore a position a curriculum stage left (``SourceCursors``), which may have been
        packed in another window: the rest of its phase is then packed in this one."""
        self._switching = True
        try:
            self.reset(state)
        finally:
            self._switching = False

    def _check_repack(self, repack: object) -> dict | None:
        if repack is None:
            return None
        windows = repack.get("windows") if isinstance(repack, dict) else None
        if (
            not isinstance(repack, dict)
            or set(repack) != {"base", "windows"}
            or repack["base"] not in ("epoch", "elastic")
            or not isinstance(windows, list)
            or not windows
            or not all(isinstance(w, dict) and isinstance(w.get("packer"), dict) for w in windows)
        ):
            raise ResumeStateError(
                "source_sequences state: field 'repack' must be {'base': 'epoch' or 'elastic', "
                "'windows': [{'seq_len', 'stride', 'packer'}, ...]}"
            )
        if repack["base"] == "elastic" and self.remainder is None:
            raise ResumeStateError(
                "source_sequences state: field 'repack' continues an elastic remainder, but "
                "this stream has none"
            )
        if not self.in_remainder or (repack["base"] == "epoch" and self.epoch == 0):
            raise ResumeStateError(
                "source_sequences state: field 'repack' needs 'remainder' true and, from an "
                "epoch, an epoch after it"
            )
        for w in windows:
            with_window(self.options, saved_window(w))
        return {"base": repack["base"], "windows": [dict(w) for w in windows]}

    def state_dict(self) -> dict:
        if not self._started:
            self.reset(None)
        assert self._packer is not None
        repack = {} if self.repack is None else {"repack": self.repack}
        return self._wrap(
            epoch=self.epoch,
            sequences=self.sequences,
            epoch_real_tokens=self.epoch_real_tokens,
            remainder=self.in_remainder,
            packer=self._packer.state_dict(),
            window=window_of(self.options),
            **repack,
        )

    @classmethod
    def served(cls, state: object) -> int:
        """The sequences a source's `state` says it served."""
        return cls.parse_state(state)["sequences"]

    @classmethod
    def progress(cls, state: dict) -> tuple[int, dict, int, bool]:
        """(source epoch, packer state, real tokens served in it, inside a remainder)."""
        state = cls.parse_state(state)
        return state["epoch"], state["packer"], state["epoch_real_tokens"], state["remainder"]

    def next_into(self, out: np.ndarray) -> tuple[list[int], int]:
        if not self._started:
            self.reset(None)
        assert self._packer is not None
        for _ in range(2):
            try:
                placed = self._packer.next_into(out)
            except StopIteration:
                # this source ran out: its next epoch, a fresh shard order
                if self.in_remainder:
                    self.in_remainder, self.repack = False, None
                else:
                    self.epoch += 1
                self.epoch_real_tokens = 0
                self._keep_overlong_counts()
                self._packer = self._open(self.epoch)
                self._packer.reset(None)
                continue
            self.sequences += 1
            self.epoch_real_tokens += placed[1]
            return placed
        raise ShardtokError(f"{self.source.display}: epoch {self.epoch} gave no sequence")

    def _next(self) -> PackedSequence:
        out = np.empty(self.window, dtype=np.int64)
        starts, length = self.next_into(out)
        return packed_sequence(out, starts, length, self.masked)

    @property
    def passes_in_runs(self) -> bool:
        """Whether this source packs concat windows without overlap (``pass_rows`` applies)."""
        return self.options.packing == "concat" and self.options.stride in (None, self.window)

    def pass_rows(self, rows: int) -> None:
        """Pass over `rows` sequences of a `passes_in_runs` source without building them, a run of
        windows at a time, opening later epochs as `next_into` does (provenance traces)."""
        if not self._started:
            self.reset(None)
        scratch = np.empty(self.window, dtype=np.int64)
        while rows:
            assert self._packer is not None
            done = self._packer.pass_windows(rows)  # type: ignore[attr-defined]
            self.sequences += done
            self.epoch_real_tokens += done * self.window
            rows -= done
            if rows:  # this epoch is spent: the next row opens the next one
                self.next_into(scratch)
                rows -= 1

    def _keep_overlong_counts(self) -> None:
        counted = getattr(self._packer, "overlong", None)
        if counted is not None:
            self._overlong["documents"] += counted.documents
            self._overlong["dropped"] += counted.dropped

    def overlong_counts(self) -> tuple[int, int]:
        """(overlong documents met, tokens they lost) in this process, all epochs so far."""
        counted = getattr(self._packer, "overlong", None)
        documents, dropped = self._overlong["documents"], self._overlong["dropped"]
        if counted is not None:
            documents, dropped = documents + counted.documents, dropped + counted.dropped
        return documents, dropped

    def close(self) -> None:
        # The packer of the source's current epoch holds its readers (Node.close follows a
        # single ``upstream``; this node's is made per epoch).
        if self._packer is not None:
            self._packer.close()


def with_source_seed(options: StreamOptions, index: int) -> StreamOptions:
    return replace(options, seed=source_seed(options.seed, index))
