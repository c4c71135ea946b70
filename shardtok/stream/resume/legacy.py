"""Upgrading states written by shardtok 0.1 (version 1: the same fields, no envelope).

0.1 saved untyped dicts, so this is the one place that tells what a state is from which keys it
has. It does so by structure, not by guesswork node by node: the options say which packer and
whether a shuffle buffer sit under the batcher, and whether the stream is a mix says how the
batcher's upstream is built. The upgraded state then goes through the same checks as any other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from shardtok.errors import ResumeStateError
from shardtok.stream.options import StreamOptions
from shardtok.stream.state import LEGACY_VERSION, wrap

PLACEMENT = ("epoch", "rank", "world_size", "worker", "num_workers")
LEGACY_FILE_FORMAT = "shardtok-stream-state"  # the CLI's state file in 0.1


class _Upgrade:
    def __init__(self, options: StreamOptions, mixed: bool):
        self.options, self.mixed = options, mixed

    # -- nodes ---------------------------------------------------------------------------
    def documents(self, s: Mapping) -> dict:
        if self.options.shuffle_buffer:
            return wrap(
                "shuffle",
                {
                    "position": s["position"],
                    "read_from": s["read_from"],
                    "upstream": wrap(
                        "reader", _pick(s["upstream"], "group", "ordinal", "position")
                    ),
                },
            )
        return wrap("reader", _pick(s, "group", "ordinal", "position"))

    @staticmethod
    def remainder_documents(s: Mapping) -> dict:
        return wrap("remainder_documents", _pick(s, "position"))

    def packer(self, s: Mapping, documents: Callable[[Mapping], dict]) -> dict:
        if self.options.packing == "concat":
            return wrap(
                "concat", {"upstream": documents(s["upstream"]), **_pick(s, "skip", "emitted")}
            )
        fields = _pick(s, "position", "open", "ready", "long", "emitted", "exhausted")
        return wrap("greedy", {"upstream": documents(s["upstream"]), **fields})

    @staticmethod
    def batcher(s: Mapping, upstream: Callable[[Mapping], dict]) -> dict:
        counts = _pick(s, "batches", "real_tokens", "sequences", "segments")
        return wrap("batcher", {"upstream": upstream(s["upstream"]), **counts})

    def slice_packer(self, s: Mapping) -> dict:
        return self.packer(s, self.documents)

    def remainder_packer(self, s: Mapping) -> dict:
        return self.packer(s, self.remainder_documents)

    def source(self, s: Mapping) -> dict:
        remainder = bool(s.get("remainder", False))
        documents = self.remainder_documents if remainder else self.documents
        return wrap(
            "source_sequences",
            {
                "epoch": s["epoch"],
                "sequences": s["sequences"],
                "epoch_real_tokens": s.get("epoch_real_tokens", 0),
                "remainder": remainder,
                "packer": self.packer(s["packer"], documents),
            },
        )

    def mix_sequences(self, s: Mapping) -> dict:
        return wrap(
            "mix_sequences", {"step": s["step"], "sources": [self.source(x) for x in s["sources"]]}
        )

    # -- elastic layouts -----------------------------------------------------------------
    def progress(self, batcher: Mapping | None) -> dict:
        if batcher is None:
            return {"packer": None, "real_tokens": 0}
        return {
            "packer": self.slice_packer(batcher["upstream"]),
            "real_tokens": batcher["real_tokens"],
        }

    def layout(self, e: Mapping) -> dict:
        return {
            **_pick(e, "world_size", "num_workers"),
            "slices": [self.progress(s) for s in e["slices"]],
        }

    def mix_layout(self, e: Mapping) -> dict:
        sources = [
            [
                {
                    "epoch": entry["epoch"],
                    **self.progress(None if entry["state"] is None else entry["state"]),
                }
                for entry in per_slice
            ]
            for per_slice in e["sources"]
        ]
        return {**_pick(e, "world_size", "num_workers"), "sources": sources}

    # -- streams and what holds them -----------------------------------------------------
    def stream(self, s: Mapping | None) -> dict | None:
        if s is None:
            return None
        if self.mixed:
            elastic = s.get("elastic")
            return wrap(
                "mixed_stream",
                {
                    **_pick(s, "first_epoch", *PLACEMENT[1:]),
                    "batcher": self.batcher(s["batcher"], self.mix_sequences),
                    "elastic": None if elastic is None else self.mix_layout(elastic),
                },
            )
        if "remainder" in s:
            return wrap(
                "elastic_stream",
                {
                    **_pick(s, *PLACEMENT),
                    "elastic": self.layout(s["elastic"]),
                    "remainder": self.batcher(s["remainder"], self.remainder_packer),
                },
            )
        return wrap(
            "slice_stream",
            {**_pick(s, *PLACEMENT), "batcher": self.batcher(s["batcher"], self.slice_packer)},
        )

    def dataset(self, s: Mapping) -> dict:
        head = _pick(s, "epoch", "fingerprint")
        if "elastic_mix" in s:
            return wrap("merged_mix", {**head, "elastic_mix": self.mix_layout(s["elastic_mix"])})
        if "elastic" in s:
            return wrap("merged", {**head, "elastic": self.layout(s["elastic"])})
        return wrap(
            "dataset",
            {**head, "placement": s["placement"], "stream": self.stream(s.get("stream"))},
        )


def _pick(s: Mapping, *keys: str) -> dict:
    missing = [k for k in keys if k not in s]
    if missing:
        raise ResumeStateError(
            f"version {LEGACY_VERSION} (shardtok 0.1) state: field {missing[0]!r} is missing"
        )
    return {k: s[k] for k in keys}


def _object(state: object) -> Mapping:
    if not isinstance(state, Mapping):
        raise ResumeStateError(f"expected a state object, got {type(state).__name__}")
    return state


def upgrade_dataset_state(state: object, options: StreamOptions, *, mixed: bool) -> dict:
    """A 0.1 ``ShardStreamDataset.state_dict()`` or ``merge_states(...)`` result, enveloped."""
    return _Upgrade(options, mixed).dataset(_object(state))


def upgrade_stream_state(state: object, options: StreamOptions, *, mixed: bool) -> dict | None:
    """A 0.1 worker stream state (slice, elastic remainder or mix), enveloped."""
    return _Upgrade(options, mixed).stream(None if state is None else _object(state))


def upgrade_loader_state(state: object, options: StreamOptions | None, *, mixed: bool) -> dict:
    """A 0.1 ``ShardLoader.state_dict()`` (stream path or memmap path), enveloped."""
    s = _object(state)
    if "shardtok_loader" not in s:
        raise ResumeStateError("not a ShardLoader state (no envelope, no 'shardtok_loader' key)")
    head = _pick(s, "num_workers", "next_worker", "workers")
    if s.get("memmap") is not None:
        return wrap("memmap_loader", {**head, "memmap": s["memmap"]})
    if options is None:
        raise ResumeStateError("a stream ShardLoader state given to a memmap ShardLoader")
    up = _Upgrade(options, mixed)
    return wrap("loader", {**head, "workers": [up.dataset(_object(w)) for w in head["workers"]]})


def upgrade_state_file(doc: Mapping, options: StreamOptions, *, mixed: bool) -> dict:
    """The CLI's 0.1 state file (format 'shardtok-stream-state', version 1), enveloped."""
    up = _Upgrade(options, mixed)
    head = _pick(doc, "epoch", "rank", "world_size", "batches", "next_worker", "fingerprint")
    workers = _pick(doc, "workers")["workers"]
    return wrap("stream_file", {**head, "workers": [up.stream(w) for w in workers]})
