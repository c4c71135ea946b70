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
from shardtok.cli.stream_args import (
    DATASET_HELP,
    add_stream_options,
    check_steps,
    mix_from,
    options_from,
)
from shardtok.cli.stream_job import StreamJob
from shardtok.cli.stream_output import (
    decode_batches,
    decoder,
    dump_batches,
    print_statistics,
    real_tokens,
    source_rows,
    stage_rows,
)
from shardtok.errors import ShardtokError, UsageError
from shardtok.stream.mix.spec import MixSpec

EPILOG = """\
examples:
  shardtok stream data/ --seq-len 2048 --batch-size 8 --max-batches 200
  # some shards of a dataset (planned as if they were all of it): a quoted brace pattern,
  # a quoted local glob, or several shard files (here as the shell expands a glob)
  shardtok stream 'data/shard-{000000..000003}.tar' --seq-len 2048 --batch-size 8
  shardtok stream 's3://bucket/web/shard-{000000..000099}.tar' --seq-len 2048 --batch-size 8
  shardtok stream 'data/shard-00000[0-3].tar' --seq-len 2048 --batch-size 8
  shardtok stream data/shard-000000.tar data/shard-000002.tar --seq-len 2048 --batch-size 8
  shardtok stream data/ --seq-len 2048 --batch-size 8 --plan --world-size 64 --num-workers 4
  shardtok stream data/ --seq-len 512 --batch-size 2 --packing greedy --max-batches 1 --decode
  shardtok stream data/ --seq-len 2048 --batch-size 8 --rank 3 --world-size 8 --dump r3.npz
  shardtok stream --source web/:0.7 --source code/:0.3 --seq-len 2048 --batch-size 8 \\
      --max-batches 1000 --state-out step1000.json
  shardtok stream --config mix.yaml --max-batches 1000 --state-in step1000.json
  # another layout: every rank's state file, here from 2 ranks into 1 rank of 4 workers
  shardtok stream data/ --seq-len 4096 --batch-size 4 --num-workers 4 --max-batches 100 \
      --state-in r0.json --state-in r1.json
  # curriculum stages (Nanotron data_stages): every stage in order, switching at its step;
  # each source continues where the last stage left it (stage_switch: restart in the config:
  # every stage starts its sources afresh, as Nanotron does)
  shardtok stream --config curriculum.yaml --max-batches 100000 --num-workers 2 --json
  # preview a mix or curriculum: per stage and source the sequences, tokens and epochs
  shardtok stream --config curriculum.yaml --plan --max-batches 100000 --world-size 64
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
    p.add_argument("dataset", nargs="*", metavar="DATASET", help=DATASET_HELP)
    p.add_argument(
        "--source",
        action="append",
        default=[],
        metavar="PATH[:WEIGHT]",
        help="mix this dataset in (repeatable; PATH may be a quoted pattern naming some of its "
        "shards); weights count tokens; without weights they are proportional to each "
        "dataset's size",
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


def _add_output_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--state-out", metavar="FILE", help="save the stream position after the last batch"
    )
    p.add_argument(
        "--state-in",
        metavar="FILE",
        action="append",
        help="continue from a saved stream position (another --batch-size continues the same "
        "rows); repeat it with the files of ALL ranks to continue with another --world-size, "
        "--num-workers or --seq-len by the remainder rule (one file does when it was the only "
        "rank)",
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
        "untrained tokens (label -100: prompts, document starts) are dimmed on a terminal and "
        "in [[double brackets]] otherwise; padding is a line naming its positions, not text",
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
        job.data,
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
        assert isinstance(spec, MixSpec)  # --source, or --config with --stage
        curriculum, config = (
            one_stage(spec, f"stage {args.stage}" if args.config else "mix"),
            spec.options,
        )
    from shardtok.cli.storage_args import retry_policy
    from shardtok.stream.factory import use_retry

    use_retry(curriculum, retry_policy(args))  # --max-attempts, --timeout
    options = options_from(args, config)
    preview = mix_preview(
        curriculum, options, max_batches=args.max_batches, world_size=args.world_size,
        num_workers=args.num_workers, epoch=args.epoch,
    )  # fmt: skip
    print(json.dumps(preview, indent=1) if args.json else format_preview(preview))
    return 0


def run(args: argparse.Namespace) -> int:
    check_steps(args.max_batches, "--max-batches")
    if args.plan and (args.source or args.config):
        return _preview_mix(args)
    job = StreamJob(args)
    plan = job.plan
    if args.plan:
        if plan is None:
            raise UsageError("--plan describes one dataset, not a mix")
        print(plan.to_json())
        return 0
    # Checked before a batch is streamed: a missing --tokenizer must not cost the run first.
    decode = decoder(args, [s.manifest for s in job.sources]) if args.decode else None
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
    count = tokens = real = segments = trained = untrained_batches = sequences = slots = 0
    first = None
    in_process = engine == "in process"
    before = job.counters() if in_process else {}
    masked, options = job.masked, job.options
    table = job.sources  # what the batches' source_ids index (a curriculum's: every stage's)
    per_source = np.zeros(len(table), dtype=np.int64)  # sequences, from the batches' source_ids
    per_stage: dict[int, np.ndarray] = {}  # stages: the same, per stage of each batch's step
    steps_before = job.taken
    started = time.perf_counter()
    for batch in batches:
        if first is None:
            first = time.perf_counter() - started
        count += 1
        # a curriculum stage may set its own batch size and sequence length
        rows, width = batch["input_ids"].shape
        sequences += rows
        slots += rows * (width + 1)
        tokens += batch["input_ids"].size
        trained += int(batch["num_trained_tokens"])
        untrained_batches += int(batch["num_trained_tokens"]) == 0
        if not in_process:  # the worker streams' own counts are out of reach
            real += real_tokens(batch, options.labels_format, options.pad_id, masked)
        segments += len(batch["cu_seqlens"]) - 1
        counts = np.bincount(np.asarray(batch["source_ids"]), minlength=len(table))
        per_source += counts
        if job.curriculum is not None:
            stage = job.curriculum.stage_of_step(steps_before + count)
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
    speed = tokens / elapsed if elapsed else 0.0
    efficiency = real / slots if slots else 0.0
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
    if job.curriculum is not None:
        shares = stage_rows(job.curriculum, per_stage)
    else:
        extras = job.shares() if in_process else []
        shares = source_rows(job.mix, job.sources, per_source, extras)
    stats["sources"] = shares
    if args.json:
        print(json.dumps(stats, indent=1))
    else:
        print_statistics(stats, overlong=options.overlong, masked=masked)
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
    if decode is not None:
        decode_batches(decode, kept, args.decode, options)
    return 0
