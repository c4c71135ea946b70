"""`shardtok stream`: the exact batches one rank would train on, with their statistics.

Runs the pipeline in process, or through a torch DataLoader with ``--num-workers K`` (K >= 1)
when torch is installed; without torch the K worker streams are interleaved in process in the
order a DataLoader would yield them, so the batches are the same either way.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator

import numpy as np

from shardtok.cli.arguments import at_least
from shardtok.cli.stream_args import mix_from, options_from
from shardtok.cli.stream_job import StreamJob
from shardtok.cli.stream_output import (
    decode_batches,
    dump_batches,
    real_tokens,
    source_rows,
    stage_rows,
)
from shardtok.errors import ShardtokError, UsageError
from shardtok.stream.nodes.base import HISTORY
from shardtok.stream.options import PACKINGS

EPILOG = """\
examples:
  shardtok stream data/ --seq-len 2048 --batch-size 8 --max-batches 200
  shardtok stream data/ --seq-len 2048 --batch-size 8 --plan --world-size 64 --num-workers 4
  shardtok stream data/ --seq-len 512 --batch-size 2 --packing greedy --max-batches 1 --decode
  shardtok stream data/ --seq-len 2048 --batch-size 8 --rank 3 --world-size 8 --dump r3.npz
  shardtok stream --source web/:0.7 --source code/:0.3 --seq-len 2048 --batch-size 8 \
      --max-batches 1000 --state-out step1000.json
  shardtok stream --config mix.yaml --max-batches 1000 --state-in step1000.json
"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "stream",
        help="stream packed batches: throughput, packing statistics, epoch plan, dumps",
        description=(
            "Stream the packed batches one rank sees in one epoch (shard permutation, "
            "token-exact slices per rank and worker, shuffle buffer, packing) and report "
            "throughput and packing statistics."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("dataset", nargs="?", help="a dataset folder or URL prefix (with index.json)")
    p.add_argument(
        "--source",
        action="append",
        default=[],
        metavar="PATH[:WEIGHT]",
        help="mix this dataset in (repeatable); weights count tokens; without weights they are "
        "proportional to each dataset's size",
    )
    p.add_argument(
        "--config", metavar="MIX.yaml", help="a mix config (Nanotron-style dataset_path)"
    )
    p.add_argument(
        "--stage", default=None, help="--config: run this data stage alone (index or name)"
    )
    add_stream_options(p)
    _add_output_options(p)
    p.set_defaults(run=run)
    return p


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
    p.add_argument("--shuffle-buffer", type=at_least(0), metavar="N", help="documents; 0 = off")
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


def _add_output_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--state-out", metavar="FILE", help="save the stream position after the last batch"
    )
    p.add_argument(
        "--state-in",
        metavar="FILE",
        action="append",
        help="continue from a saved stream position; repeat it with the files of ALL ranks to "
        "finish their epoch with another --world-size/--num-workers",
    )
    p.add_argument(
        "--ignore-fingerprint",
        action="store_true",
        help="--state-in: resume even if the sources or options differ from the saved ones",
    )
    p.add_argument(
        "--max-batches",
        type=at_least(1),
        default=None,
        metavar="N",
        help="stop after N batches; one dataset runs on into epochs --epoch + 1, ... to get them",
    )
    p.add_argument(
        "--allow-mixed-tokenizers",
        action="store_true",
        help="mix datasets whose tokenizer fingerprints or vocabularies differ (refused by "
        "default: their ids would be read as each other's tokens)",
    )
    p.add_argument(
        "--dump",
        metavar="OUT.npz",
        help="save the exact batches (input_ids, labels, position_ids, document_ids, "
        "cu_seqlens, max_seqlen, num_trained_tokens, source_ids)",
    )
    p.add_argument(
        "--decode",
        type=int,
        nargs="?",
        const=2,
        default=0,
        metavar="N",
        help="print the text of the first N sequences (default 2), document by document; "
        "untrained tokens (label -100: prompts, padding, document starts) are dimmed on a "
        "terminal and in [[double brackets]] otherwise",
    )
    p.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="tokenizer for --decode (default: the bundled one, if the dataset was made with it)",
    )
    p.add_argument(
        "--plan",
        action="store_true",
        help="print the epoch plan (JSON) and exit; for a mix or stages (with --max-batches N): "
        "per stage and source the sequences, tokens and source epochs of the first N batches "
        "per rank (a table, or --json)",
    )
    p.add_argument("--json", action="store_true", help="print the statistics as JSON")


def _torch_batches(args, job: StreamJob) -> Iterator[dict] | None:
    if args.num_workers < 1 or args.state_in or args.state_out:
        return None  # states are taken from the in-process worker streams (same batches)
    try:
        import torch  # noqa: F401
    except ImportError:
        return None
    from torch.utils.data import DataLoader

    from shardtok.torch import ShardStreamDataset

    dataset = ShardStreamDataset(
        job.mix if job.mix is not None else job.sources[0].location,
        options=job.options,
        epoch=args.epoch,
        rank=args.rank,
        world_size=args.world_size,
        num_workers=args.num_workers,
        # a mix, or one dataset on into further epochs
        **({"num_batches": args.max_batches} if args.max_batches is not None else {}),
    )
    loader = DataLoader(dataset, batch_size=None, num_workers=args.num_workers)
    return ({k: v.numpy() if hasattr(v, "numpy") else v for k, v in b.items()} for b in loader)


def _preview_mix(args: argparse.Namespace) -> int:
    """`--plan` for a mix or curriculum: what the first --max-batches batches read per source."""
    from shardtok.stream.mix.stages import load_curriculum
    from shardtok.stream.preview import format_preview, mix_preview, one_stage

    if args.max_batches is None:
        raise UsageError(
            "a mix preview counts the first N batches per rank: give --max-batches N (the "
            "run's training steps)"
        )
    if args.config and getattr(args, "stage", None) is None:  # every stage
        if args.dataset or args.source:
            raise UsageError("give one of DATASET, --source or --config")
        curriculum = load_curriculum(args.config)
        config = curriculum.options
    else:
        spec = mix_from(args)
        assert spec is not None
        curriculum, config = (
            one_stage(spec, f"stage {args.stage}" if args.config else "mix"),
            spec.options,
        )
    options = options_from(args, config)
    preview = mix_preview(
        curriculum, options, max_batches=args.max_batches, world_size=args.world_size,
        num_workers=args.num_workers, epoch=args.epoch,
    )  # fmt: skip
    print(json.dumps(preview, indent=1) if args.json else format_preview(preview))
    return 0


def run(args: argparse.Namespace) -> int:
    if args.plan and (args.source or args.config):
        return _preview_mix(args)
    job = StreamJob(args)
    plan = job.plan
    if args.plan:
        if plan is None:
            raise UsageError("--plan describes one dataset, not a mix")
        print(plan.to_json())
        return 0
    if not args.json and plan is not None:
        print(plan.summary())
    if args.state_in:
        job.restore(args.state_in, strict=not args.ignore_fingerprint)
    keep = bool(args.dump or args.decode)
    batches = _torch_batches(args, job)
    engine = f"DataLoader with {args.num_workers} workers" if batches is not None else "in process"
    if batches is None:
        batches = job.batches()
    kept: list[dict] = []
    count = tokens = real = segments = trained = untrained_batches = 0
    first = None
    in_process = engine == "in process"
    before = job.counters() if in_process else {}
    masked, options = job.masked, job.options
    table = job.source_table
    per_source = np.zeros(len(table), dtype=np.int64)  # sequences, from the batches' source_ids
    per_stage: dict[int, np.ndarray] = {}  # stages: the same, per stage of each batch's step
    steps_before = job.taken
    started = time.perf_counter()
    for batch in batches:
        if first is None:
            first = time.perf_counter() - started
        count += 1
        tokens += batch["input_ids"].size
        trained += int(batch["num_trained_tokens"])
        untrained_batches += int(batch["num_trained_tokens"]) == 0
        if not in_process:  # the worker streams' own counts are out of reach
            real += real_tokens(batch, options.labels_format, options.pad_id, masked)
        segments += len(batch["cu_seqlens"]) - 1
        counts = np.bincount(np.asarray(batch["source_ids"]), minlength=len(table))
        per_source += counts
        if job.staged:
            stage = job.mix.stage_of_step(steps_before + count)  # type: ignore[union-attr]
            per_stage[stage] = per_stage.get(stage, 0) + counts
        if keep:
            kept.append({k: np.array(v) for k, v in batch.items()})
        if args.max_batches is not None and count >= args.max_batches:
            break
    elapsed = time.perf_counter() - started
    counted = {}
    if in_process:  # exact: what the packers put into the yielded sequences
        counted = {k: v - before[k] for k, v in job.counters().items()}
        real = counted.pop("real_tokens")
    sequences = count * job.options.batch_size
    speed = tokens / elapsed if elapsed else 0.0
    efficiency = real / (sequences * (job.options.seq_len + 1)) if sequences else 0.0
    per_sequence = segments / sequences if sequences else 0.0
    per_epoch = plan.batches_per_rank if plan is not None else None
    stats = {
        "engine": engine,
        "batches": count,
        "batches_per_epoch": per_epoch,
        "input_tokens": tokens,
        "seconds": round(elapsed, 4),
        "tokens_per_second": speed,
        "first_batch_seconds": round(first or 0.0, 4),
        "packing_efficiency": efficiency,
        "documents_per_sequence": per_sequence,
        "trained_tokens": trained,
        "trained_share": trained / tokens if tokens else 0.0,
        "batches_without_trained_tokens": untrained_batches,
        **counted,
    }
    # Counted from the batches, so every engine reports them; the worker streams' own extras
    # (source epochs reached) only where they live in this process.
    if job.staged:
        shares = stage_rows(job.mix, per_stage)  # type: ignore[arg-type]
    else:
        extras = job.shares() if in_process else []
        shares = source_rows(table, job.source_weights, per_source, extras)
    stats["sources"] = shares
    if args.json:
        print(json.dumps(stats, indent=1))
    else:
        of = f" of {per_epoch:,}" if per_epoch is not None else ""
        if per_epoch is not None and count > per_epoch:  # --max-batches: on into later epochs
            of = f" ({per_epoch:,} per epoch)"
        print(
            f"streamed {count:,}{of} batches ({engine}): "
            f"{tokens:,} input tokens in {elapsed:.3f} s = "
            f"{speed / 1e6:.1f} M tokens/s; first batch after {first or 0.0:.3f} s"
        )
        print(
            f"packing: {100 * efficiency:.2f}% of slots hold real tokens, "
            f"{per_sequence:.2f} document segments per sequence; "
            f"{trained:,} labels trained ({100 * stats['trained_share']:.2f}% of "
            f"{tokens:,}{', the rest prompts, padding or document starts' if masked else ''})"
        )
        if untrained_batches:
            print(
                f"warning: {untrained_batches:,} batches have no trained label (a mean loss over "
                "one is NaN); with loss masks, check --overlong and --seq-len against the "
                "conversation lengths"
            )
        if counted.get("overlong_documents"):
            print(
                f"overlong documents ({options.overlong or 'truncate or split by source'}): "
                f"{counted['overlong_documents']:,} met, "
                f"{counted['overlong_tokens_dropped']:,} tokens dropped"
            )
        for row in shares if len(shares) > 1 else []:
            weight = "-" if row["weight"] is None else f"{100 * row['weight']:.2f}%"
            epochs = f", epochs {row['epochs']}" if "epochs" in row else ""
            stage = f"stage {row['stage']!r} " if "stage" in row else ""
            of = "of the stage's" if stage else "of these"
            print(
                f"{stage}source {row['source']}: weight {weight}, {row['sequences']:,} sequences "
                f"= {100 * row['share']:.2f}% {of} batches{epochs}"
            )
    if args.state_out:
        if engine != "in process":  # pragma: no cover - _torch_batches declines with states
            raise ShardtokError("--state-out needs the in-process engine")
        job.save(args.state_out)
        if not args.json:
            print(f"saved the stream position after {job.taken:,} batches to {args.state_out}")
    if args.dump:
        plan_json = plan.to_json() if plan is not None else json.dumps(job.fingerprint)
        dump_batches(args.dump, kept, plan_json)
        if not args.json:
            print(f"wrote {len(kept)} batches to {args.dump}")
    if args.decode:
        decode_batches(args, job.sources[0].manifest, kept, options.labels_format)
    return 0
