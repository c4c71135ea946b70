"""The worker streams one rank runs for `shardtok stream`: a dataset, a weighted mix or
curriculum stages, the DataLoader's round robin over its workers in process, and
saving/restoring their positions."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator

from shardtok.cli.stream_args import setup_from
from shardtok.dataset.source import DatasetSource
from shardtok.errors import ShardtokError, UsageError
from shardtok.stream.epochs import EpochsStream
from shardtok.stream.factory import check_stream_state
from shardtok.stream.mix.spec import MixSpec
from shardtok.stream.mix.stages import Curriculum
from shardtok.stream.nodes.base import PlacedStream
from shardtok.stream.rank import RoundRobin
from shardtok.stream.resume.fingerprint import check_fingerprint
from shardtok.stream.resume.merge import cuts_rows_anew, merge_worker_states
from shardtok.stream.resume.rank_state import RankState, load_state_file, save_state_file
from shardtok.stream.resume.saved import MergedState, Placement, WorkerState, saved_position
from shardtok.stream.staged import StagedStream


class StreamJob:
    """The worker streams of one rank, in process, and the DataLoader's round robin over them."""

    def __init__(self, args: argparse.Namespace):
        self.setup = setup_from(args)
        self.options = self.setup.options  # with what the data decides
        self.mix, self.curriculum = self.setup.mix, self.setup.curriculum
        self.sources = list(self.setup.sources)
        self.args = args
        self.workers = max(args.num_workers, 1)
        self.fingerprint = self.setup.fingerprint
        self.plan = None
        if self.single:
            self.plan = self.setup.plan(
                epoch=args.epoch, world_size=args.world_size, num_workers=self.workers
            )
        elif args.max_batches is None:
            what = "curriculum stages never end (the last one runs on)" if self.curriculum else ""
            raise UsageError(f"{what or 'a mix never ends'}: give --max-batches")
        # One dataset with --max-batches runs on into further epochs (an EpochsStream; a saved
        # slice_stream state still resumes as its one epoch).
        self.num_batches: int | None = None
        self._budget(0)
        self.streams: list[PlacedStream] = [self._stream(w) for w in range(self.workers)]
        self.next_worker = 0
        self.taken = 0

    @property
    def single(self) -> bool:
        """Whether one dataset is streamed (not a mix, nor stages)."""
        return self.mix is None and self.curriculum is None

    @property
    def data(self) -> DatasetSource | MixSpec | Curriculum:
        """What ``ShardStreamDataset`` is given to stream the same batches."""
        return self.curriculum or self.mix or self.sources[0]

    def _budget(self, taken: int) -> None:
        """Enough batches per worker for --max-batches more after `taken` (a bound only: the
        run stops by count, and a resumed run continues past its first run's)."""
        if self.single and self.args.max_batches is not None:
            self.num_batches = -(-(taken + self.args.max_batches) // self.workers)

    def _placement(self, worker: int) -> Placement:
        return Placement(self.args.rank, self.args.world_size, worker, self.workers)

    def _stream(self, worker: int, resume: dict | MergedState | None = None) -> PlacedStream:
        return self.setup.stream(
            self._placement(worker), epoch=self.args.epoch, resume=resume,
            num_batches=self.num_batches,
        )  # fmt: skip

    def restore(self, paths: list[str], strict: bool) -> None:
        """Continue from one rank's state file in the same layout (exact), or from the files of
        ALL ranks of another layout (elastic: merge_states, see docs/RESUME.md)."""
        saved = [load_state_file(path, check_state=check_stream_state) for path in paths]
        doc = saved[0]
        same_layout = (
            len(saved) == 1
            and (doc.rank, doc.world_size) == (self.args.rank, self.args.world_size)
            and len(doc.workers) == self.workers
            and not cuts_rows_anew(doc.fingerprint, self.options)
        )
        for path, doc in zip(paths, saved, strict=True):
            problems = check_fingerprint(
                doc.fingerprint, self.fingerprint, strict=strict, merged=not same_layout,
                **saved_position(*doc.workers),
            )  # fmt: skip
            for problem in problems:
                print(f"warning: {path}: resuming anyway: {problem}", file=sys.stderr)
        doc = saved[0]
        if doc.epoch != self.args.epoch:
            raise ShardtokError(f"{paths[0]}: saved in epoch {doc.epoch}: pass --epoch {doc.epoch}")
        if same_layout:
            self._budget(doc.batches)
            self.streams = [self._stream(w, state) for w, state in enumerate(doc.workers)]
            self.next_worker = doc.next_worker
            self.taken = doc.batches
            return
        states = [
            WorkerState(
                d.epoch, Placement(d.rank, d.world_size, w, len(d.workers)), state, d.fingerprint
            )
            for d in saved
            for w, state in enumerate(d.workers)
        ]
        merged = merge_worker_states(states)
        self.streams = [self._stream(w, merged) for w in range(self.workers)]
        # Chained streams (stages, epochs) count the rank's steps on from the step of the merge,
        # as their states do (a trace from the saved file counts them so too).
        self.next_worker, self.taken = 0, getattr(self.streams[0], "first_step", 0)

    def save(self, path: str) -> None:
        state = RankState(
            epoch=self.args.epoch,
            rank=self.args.rank,
            world_size=self.args.world_size,
            batches=self.taken,
            next_worker=self.next_worker,
            workers=[s.state_dict() for s in self.streams],
            fingerprint=self.fingerprint,
        )
        save_state_file(path, state)

    def batches(self) -> Iterator[dict]:
        """The rank's batches, its worker streams in turn (the DataLoader's order)."""
        turns = RoundRobin(self.workers, self.next_worker)
        while (worker := turns.take()) is not None:
            try:
                batch = next(self.streams[worker])
            except StopIteration:
                turns.done(worker)
                continue
            self.next_worker = turns.next_worker
            self.taken += 1
            yield batch

    @property
    def masked(self) -> bool:
        """Whether any source has loss masks."""
        return any(source.manifest.masked for source in self.sources)

    def counters(self) -> dict:
        """Summed over this rank's worker streams: real tokens packed into the sequences
        yielded, and overlong documents met with the tokens they lost (in this process)."""
        out = {"real_tokens": 0, "overlong_documents": 0, "overlong_tokens_dropped": 0}
        for stream in self.streams:
            if isinstance(stream, StagedStream):
                for key, value in stream.totals().items():
                    out[key] += value
                continue
            # An epochs stream sums the epochs it went through; its batcher is the current one's.
            epochs = isinstance(stream, EpochsStream)
            stats = stream.stats() if epochs else stream.batcher.stats()  # type: ignore[attr-defined]
            rows = stream.stats()["sources"] if self.mix is not None else [stats]  # type: ignore[attr-defined]
            out["real_tokens"] += stats["real_tokens"]
            for row in rows:
                out["overlong_documents"] += row.get("overlong_documents", 0)
                out["overlong_tokens_dropped"] += row.get("overlong_tokens_dropped", 0)
        return out

    def shares(self) -> list[dict]:
        """Per source of a mix, over this rank's worker streams: sequences, share, epochs
        reached. (Stages: the command counts them per stage from the batches.)"""
        if self.mix is None:
            return []
        rows = []
        per_stream = [s.stats()["sources"] for s in self.streams]  # type: ignore[attr-defined]
        total = sum(r["sequences"] for shares in per_stream for r in shares) or 1
        for i, source in enumerate(self.mix.sources):
            sequences = sum(shares[i]["sequences"] for shares in per_stream)
            rows.append(
                {
                    "source": source.display,
                    "weight": self.mix.shares[i],
                    "sequences": sequences,
                    "share": sequences / total,
                    "epochs": [shares[i]["epoch"] for shares in per_stream],
                }
            )
        return rows
