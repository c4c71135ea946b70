"""The arguments that say what `shardtok stream` and `shardtok trace` stream: their
definitions, and turning them into stream options and a dataset, mix or curriculum stages."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from shardtok.cli.arguments import at_least
from shardtok.dataset.source import DatasetSource
from shardtok.errors import UsageError
from shardtok.stream.factory import StreamSetup
from shardtok.stream.mix.spec import MixSpec, mix_spec
from shardtok.stream.mix.stages import Curriculum, load_curriculum, load_stage
from shardtok.stream.options import HISTORY, OPTION_NAMES, PACKINGS, StreamOptions
from shardtok.stream.provenance.trace import MAX_STEPS


def add_stream_options(p: argparse.ArgumentParser) -> None:
    """The options that decide the batches (shape, packing, shuffling, placement): shared by
    `shardtok stream` and `shardtok trace`, so both read a command line alike."""
    p.add_argument("--seq-len", type=at_least(1), metavar="L", help="input tokens per sequence")
    p.add_argument("--batch-size", type=at_least(1), metavar="B", help="sequences per batch")
    p.add_argument(
        "--packing",
        choices=PACKINGS,
        default=None,
        help="default: greedy when a dataset has loss masks (fine-tuning data), else concat",
    )
    p.add_argument("--seed", type=at_least(0), default=None)
    p.add_argument("--epoch", type=at_least(0), default=0)
    p.add_argument("--rank", type=at_least(0), default=0)
    p.add_argument("--world-size", type=at_least(1), default=1)
    p.add_argument(
        "--num-workers",
        type=at_least(0),
        default=0,
        metavar="K",
        help="DataLoader workers (0: in process); the epoch is split over world size x max(K, 1)",
    )
    p.add_argument(
        "--shuffle-buffer",
        type=at_least(0),
        metavar="N",
        help="documents the shuffle buffer holds at most (default 4096; 0 = no shuffling)",
    )
    p.add_argument(
        "--shuffle-tokens",
        type=at_least(0),
        metavar="N",
        help="tokens it holds at most, about (default 4194304; 0 = documents only, as "
        "before this option existed: a state saved then resumes with 0)",
    )
    p.add_argument(
        "--interleave", type=at_least(1), metavar="N", help="shards read at once per worker"
    )
    p.add_argument("--stride", type=at_least(1), help="concat window stride (default seq_len + 1)")
    p.add_argument("--lookahead", type=at_least(1), help="greedy: open sequences (default 8)")
    p.add_argument("--pad-id", type=at_least(0), help="greedy, bfd: padding token id (default 0)")
    p.add_argument(
        "--bfd-window",
        type=at_least(1),
        metavar="N",
        help=f"bfd: documents packed at once (default 1000, at most {HISTORY})",
    )
    p.add_argument(
        "--overlong",
        choices=("split", "drop", "truncate"),
        default=None,
        help="greedy, bfd: a document longer than seq_len + 1 is split into sequences, "
        "truncated to its first seq_len + 1 tokens, or dropped (default: truncate for data "
        "with loss masks, split otherwise); counted in the plan",
    )
    p.add_argument(
        "--mask-boundary-labels",
        action="store_true",
        default=None,
        help="label -100 where the target is the first token of another document",
    )
    p.add_argument(
        "--labels-format",
        choices=("shifted", "hf"),
        default=None,
        help="shifted (default): labels[i] is the target of input_ids[i]; hf: aligned with "
        "input_ids for models that shift internally (transformers' *ForCausalLM)",
    )


def parse_source_arg(text: str) -> tuple[str, float | None]:
    """``PATH:WEIGHT`` from the command line (the weight is optional; URLs keep their colons)."""
    head, sep, tail = text.rpartition(":")
    if sep and head:
        try:
            return head, float(tail)
        except ValueError:
            pass
    return text, None


def spec_from_args(sources: Sequence[str], storage_options: dict | None = None) -> MixSpec:
    """``--source PATH[:WEIGHT]`` values: all weighted, or none (then proportional to size)."""
    parsed = [parse_source_arg(s) for s in sources]
    given = [w is not None for _, w in parsed]
    if any(given) and not all(given):
        raise UsageError("give a weight to every --source (PATH:WEIGHT) or to none")
    if all(given):
        mapping: dict[str, float] = {}
        for path, weight in parsed:
            if path in mapping:
                raise UsageError(f"--source {path} given twice")
            mapping[path] = weight  # type: ignore[assignment]
        return mix_spec(mapping, storage_options)
    return mix_spec([p for p, _ in parsed], storage_options, list_is_mix=True)


DATASET_HELP = (
    "a dataset folder or URL prefix (with index.json), or some of its shards: one or more "
    ".tar files or URLs, a quoted brace pattern ('data/shard-{000000..000009}.tar', also for "
    "s3:// and https://) or a quoted glob ('data/shard-*.tar', local paths only)"
)


def dataset_from(entries: Sequence[str]) -> DatasetSource:
    """The DATASET positional(s): one folder, URL prefix, shard, pattern or glob, or several
    shard files (what a shell makes of an unquoted glob) of one dataset."""
    return DatasetSource.of(entries[0] if len(entries) == 1 else list(entries))


def check_steps(value: int | None, flag: str) -> None:
    """`value` (from `flag`) within what a stream, a preview or a trace can count, else a
    UsageError."""
    if value is not None and value > MAX_STEPS:
        raise UsageError(
            f"{flag} {value:,} is more than shardtok counts steps to ({MAX_STEPS:,} per rank)"
        )


def options_from(args: argparse.Namespace, config: dict | None = None) -> StreamOptions:
    """Command-line values win over the mix config, which wins over the defaults."""
    given = {name: getattr(args, name) for name in OPTION_NAMES}
    merged = {**(config or {}), **{k: v for k, v in given.items() if v is not None}}
    for key in ("seq_len", "batch_size"):
        if key not in merged:
            raise UsageError(
                f"--{key.replace('_', '-')} is required (or set it in the --config file)"
            )
    return StreamOptions(**merged)


def mix_from(args: argparse.Namespace) -> MixSpec | Curriculum | None:
    """What to stream: None (one DATASET), a mix, or curriculum stages (``--config`` with two or
    more ``data_stages`` and no ``--stage``; a one-stage config is a plain mix)."""
    chosen = [bool(args.dataset), bool(args.source), bool(args.config)]
    if sum(chosen) != 1:
        # trace takes its config as the positional target: it has no --config to offer
        offered = (
            "CONFIG_OR_DATASET or --source"
            if getattr(args, "command", None) == "trace"
            else "one of DATASET, --source or --config"
        )
        raise UsageError(f"give {offered}")
    if args.rank >= args.world_size:
        raise UsageError(f"--rank {args.rank} is outside --world-size {args.world_size}")
    if args.source:
        spec = spec_from_args(args.source)
    elif args.config and args.stage is None:
        curriculum = load_curriculum(args.config)
        if len(curriculum.stages) > 1:
            for each in curriculum.stages:
                each.mix.allow_mixed_tokenizers |= args.allow_mixed_tokenizers
            return curriculum
        spec = curriculum.stage_spec(0)
    elif args.config:
        spec = load_stage(args.config, int(args.stage) if args.stage.isdigit() else args.stage)
    else:
        return None
    spec.allow_mixed_tokenizers = spec.allow_mixed_tokenizers or args.allow_mixed_tokenizers
    return spec


def setup_from(args: argparse.Namespace) -> StreamSetup:
    """What DATASET, --source or --config (all its stages, or --stage) stream, with the stream
    options (command line over config over defaults)."""
    from shardtok.cli.storage_args import retry_policy
    from shardtok.stream.factory import use_retry

    mix = mix_from(args)
    options = options_from(args, mix.options if mix is not None else None)
    data = mix if mix is not None else dataset_from(args.dataset)
    use_retry(data, retry_policy(args))  # --max-attempts, --timeout: before the first read
    return StreamSetup.of(data, options)
