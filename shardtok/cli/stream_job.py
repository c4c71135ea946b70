"""The worker streams one rank runs for `shardtok stream`: a dataset or a weighted mix, the
DataLoader's round robin over its workers in process, and saving/restoring their positions."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator

from shardtok.errors import ShardtokError
from shardtok.storage.dataset import DatasetSource
from shardtok.stream.build import plan_for
from shardtok.stream.mix.spec import MixSpec, load_mix_config, spec_from_args
from shardtok.stream.mix.stream import MixedStream
from shardtok.stream.nodes.base import Node
from shardtok.stream.options import StreamOptions
from shardtok.stream.resume.elastic import ElasticStream
from shardtok.stream.resume.fingerprint import check_fingerprint, stream_fingerprint
from shardtok.stream.resume.merge import merge_states
from shardtok.stream.resume.state_file import load_state_file, save_state_file
from shardtok.stream.slice_stream import SliceStream


def options_from(args: argparse.Namespace, config: dict | None = None) -> StreamOptions:
    """Command-line values win over the mix config, which wins over the defaults."""
    given = {
        "seq_len": args.seq_len,
        "batch_size": args.batch_size,
        "packing": args.packing,
        "seed": args.seed,
        "shuffle_buffer": args.shuffle_buffer,
        "interleave": args.interleave,
        "stride": args.stride,
        "lookahead": args.lookahead,
        "pad_id": args.pad_id,
        "mask_boundary_labels": args.mask_boundary_labels,
    }
    merged = {**(config or {}), **{k: v for k, v in given.items() if v is not None}}
    for key in ("seq_len", "batch_size"):
        if key not in merged:
            raise SystemExit(
                f"shardtok stream: error: --{key.replace('_', '-')} is required "
                "(or set it in the --config file)"
            )
    return StreamOptions(**merged)


def mix_from(args: argparse.Namespace) -> MixSpec | None:
    chosen = [bool(args.dataset), bool(args.source), bool(args.config)]
    if sum(chosen) != 1:
        raise SystemExit("shardtok stream: error: give one of DATASET, --source or --config")
    if args.source:
        return spec_from_args(args.source)
    if args.config:
        stage = int(args.stage) if args.stage.isdigit() else args.stage
        return load_mix_config(args.config, stage=stage)
    return None


class StreamJob:
    """The worker streams of one rank, in process, and the DataLoader's round robin over them."""

    def __init__(self, args: argparse.Namespace):
        self.mix = mix_from(args)
        self.options = options_from(args, self.mix.options if self.mix is not None else None)
        if self.mix is not None:
            self.sources = list(self.mix.sources)
        else:
            self.sources = [DatasetSource(args.dataset)]
        self.args = args
        self.workers = max(args.num_workers, 1)
        weights = self.mix.weights if self.mix is not None else None
        self.fingerprint = stream_fingerprint(self.sources, weights, self.options)
        self.plan = None
        if self.mix is None:
            self.plan = plan_for(
                self.sources[0],
                self.options,
                epoch=args.epoch,
                world_size=args.world_size,
                num_workers=self.workers,
            )
        elif args.max_batches is None:
            raise SystemExit("shardtok stream: error: a mix never ends: give --max-batches")
        self.streams: list[Node[dict]] = [self._stream(w) for w in range(self.workers)]
        self.next_worker = 0
        self.taken = 0

    def _stream(self, worker: int, elastic: dict | None = None) -> Node[dict]:
        """Worker `worker`'s stream; `elastic` continues another layout's saved epoch."""
        placement = dict(
            rank=self.args.rank,
            world_size=self.args.world_size,
            worker=worker,
            num_workers=self.workers,
        )
        if self.mix is not None:
            return MixedStream(
                self.mix, self.options, first_epoch=self.args.epoch, elastic=elastic, **placement
            )
        if elastic is not None:
            return ElasticStream(
                self.sources[0], self.options, elastic, epoch=self.args.epoch, **placement
            )
        return SliceStream(self.sources[0], self.options, epoch=self.args.epoch, **placement)

    def restore(self, paths: list[str], strict: bool) -> None:
        """Continue from one rank's state file in the same layout (exact), or from the files of
        ALL ranks of another layout (elastic: merge_states, see docs/STREAMING.md)."""
        saved = [load_state_file(path) for path in paths]
        for path, doc in zip(paths, saved, strict=True):
            problems = check_fingerprint(doc.get("fingerprint"), self.fingerprint, strict=strict)
            for problem in problems:
                print(f"warning: {path}: resuming anyway: {problem}", file=sys.stderr)
        doc = saved[0]
        if int(doc["epoch"]) != self.args.epoch:
            raise ShardtokError(
                f"{paths[0]}: saved in epoch {doc['epoch']}: pass --epoch {doc['epoch']}"
            )
        same_layout = (
            len(saved) == 1
            and (doc["rank"], doc["world_size"]) == (self.args.rank, self.args.world_size)
            and len(doc["workers"]) == self.workers
        )
        if same_layout:
            for w, state in enumerate(doc["workers"]):
                if state is not None and "elastic" in state:  # inside an elastic remainder
                    self.streams[w] = self._stream(w, state["elastic"])
                self.streams[w].reset(state)
            self.next_worker = int(doc["next_worker"])
            self.taken = int(doc["batches"])
            return
        states = [
            {
                "epoch": d["epoch"],
                "placement": {
                    "rank": d["rank"],
                    "world_size": d["world_size"],
                    "worker": w,
                    "num_workers": len(d["workers"]),
                },
                "stream": state,
                "fingerprint": d["fingerprint"],
            }
            for d in saved
            for w, state in enumerate(d["workers"])
        ]
        merged = merge_states(states)
        elastic = merged.get("elastic_mix", merged.get("elastic"))
        self.streams = [self._stream(w, elastic) for w in range(self.workers)]
        self.next_worker = self.taken = 0

    def save(self, path: str) -> None:
        save_state_file(
            path,
            fingerprint=self.fingerprint,
            workers=[s.state_dict() for s in self.streams],
            next_worker=self.next_worker,
            batches=self.taken,
            epoch=self.args.epoch,
            rank=self.args.rank,
            world_size=self.args.world_size,
        )

    def batches(self) -> Iterator[dict]:
        while True:
            stream = self.streams[self.next_worker]
            try:
                batch = next(stream)
            except StopIteration:
                return
            self.next_worker = (self.next_worker + 1) % self.workers
            self.taken += 1
            yield batch

    def shares(self) -> list[dict]:
        """Per source, over this rank's worker streams: sequences, share, epochs reached."""
        if self.mix is None:
            return []
        rows = []
        per_stream = [s.stats()["sources"] for s in self.streams]  # type: ignore[attr-defined]
        total = sum(r["sequences"] for shares in per_stream for r in shares) or 1
        for i, source in enumerate(self.mix.sources):
            sequences = sum(shares[i]["sequences"] for shares in per_stream)
            rows.append(
                {
                    "source": source.location,
                    "weight": self.mix.shares[i],
                    "sequences": sequences,
                    "share": sequences / total,
                    "epochs": [shares[i]["epoch"] for shares in per_stream],
                }
            )
        return rows
