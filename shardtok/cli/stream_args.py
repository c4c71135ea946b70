"""Turning `shardtok stream` arguments into stream options and a mix (or curriculum stages)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from shardtok.errors import UsageError
from shardtok.stream.mix.spec import MixSpec, mix_spec
from shardtok.stream.mix.stages import Curriculum, load_curriculum, load_stage
from shardtok.stream.options import OPTION_NAMES, StreamOptions


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
    return mix_spec([p for p, _ in parsed], storage_options)


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
        raise UsageError("give one of DATASET, --source or --config")
    if args.rank >= args.world_size:
        raise UsageError(f"--rank {args.rank} is outside --world-size {args.world_size}")
    if args.source:
        spec = spec_from_args(args.source)
    elif args.config and args.stage is None:
        curriculum = load_curriculum(args.config)
        if len(curriculum.stages) > 1:
            for stage in curriculum.stages:
                stage.mix.allow_mixed_tokenizers |= args.allow_mixed_tokenizers
            return curriculum
        spec = curriculum.stage_spec(0)
    elif args.config:
        stage = int(args.stage) if args.stage.isdigit() else args.stage
        spec = load_stage(args.config, stage)
    else:
        return None
    spec.allow_mixed_tokenizers = spec.allow_mixed_tokenizers or args.allow_mixed_tokenizers
    return spec
