"""`shardtok convert plan | run-units | status | merge`: the conversion's phases, for schedulers.

The first word after ``convert`` picks the phase (an input file with such a name is given as
``./plan``); anything else is the one-command ``shardtok convert INPUT...``. Each phase is its
own parser, so its --help shows only its options.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys

from shardtok.cli import logs, storage_args
from shardtok.cli.arguments import at_least

PLAN_DESCRIPTION = """\
Write the plan of a conversion into OUTPUT/.shardtok-work/: the input files cut into work units,
the options, and the tokenizer (workers need no tokenizer files). Then tokenize the units with
`shardtok convert run-units` on as many machines as you like, and write the dataset with
`shardtok convert merge`. The result is byte-identical to `shardtok convert INPUT... --workers 1`
with the same --unit-size.

Planning again with the same inputs and options keeps the units already done (the shard size,
compression and --on-bad-record may change: they only matter to the merge); other inputs or
options start over. OUTPUT may be a local folder or an object store (s3://bucket/prefix/, any
fsspec URL; credentials come from the store's usual configuration). Inputs on an object store
are recognised by size and ETag.
"""

SLURM_EPILOG = """\
phases:
  shardtok convert plan INPUT... -o OUT [options]    this command
  shardtok convert run-units -o OUT --rank R --world-size W [--workers N]
  shardtok convert status -o OUT [--json]            exit 0 when every unit is done
  shardtok convert merge -o OUT [--jobs N]

a Slurm job array (one task per rank; shardtok reads no environment variables, so the script
passes the rank and the world size explicitly; a requeued or repeated task is harmless):

  shardtok convert plan 'crawl/*.jsonl.zst' -o /shared/data --tokenizer ./llama3/
  cat > tokenize.sbatch <<'EOF'
  #!/bin/bash
  #SBATCH --array=0-63 --cpus-per-task=32
  shardtok convert run-units -o /shared/data --workers 32 \\
      --rank "$SLURM_ARRAY_TASK_ID" --world-size "$SLURM_ARRAY_TASK_COUNT"
  EOF
  sbatch --wait tokenize.sbatch
  shardtok convert status -o /shared/data && shardtok convert merge -o /shared/data
"""

RUN_UNITS_DESCRIPTION = """\
Tokenize the work units i with i = RANK (mod WORLD_SIZE) of the plan in OUTPUT that are not done
yet, in --workers local processes. Run it as often as you like, and on as many machines: done
units are kept, a unit killed halfway is simply done again, and two copies of one rank at once
write the same bytes. A unit that stops the conversion (a bad record under --on-bad-record
error) is recorded; the command then exits 1 naming it (with the file's line once every unit
before it is done), and `shardtok convert status` and `merge` report the same first failure.
"""

STATUS_DESCRIPTION = """\
Count the work units of the plan in OUTPUT that are done, failed and still to do, and name the
first failure in input order: with the file and line of the one-command convert when every unit
before it is done, else its unit and piece.

exit status:
  0  complete: every unit is done (run merge), or the dataset is already merged
  1  a unit stops the conversion (the first failure is printed); or the work folder cannot be read
  2  a usage mistake, such as no plan in OUTPUT
  3  units are still to be done (run-units has not finished)
"""

MERGE_DESCRIPTION = """\
Write the dataset from the finished work units: the shards (in parallel, --jobs processes),
rejects.jsonl (--on-bad-record skip), then index.json, byte-identical to the one-command convert.
Then the work folder is removed (--keep-work keeps it). A unit that stops the conversion is
reported exactly as the one-command convert reports it; a unit not yet done is named.
"""

PHASES = ("plan", "run-units", "status", "merge")


def mount(convert_parser: argparse.ArgumentParser, add_arguments, options) -> None:
    """Make `convert_parser` hand `convert PHASE ...` to the phase's own parser. `add_arguments`
    adds the conversion options to a parser, and `options(args)` makes ConvertOptions of them
    (shardtok.cli.convert's, passed in: that module imports this one)."""
    base = type(convert_parser)
    phases = {
        "plan": _plan_parser(base, add_arguments, options),
        "run-units": _run_units_parser(base),
        "status": _status_parser(base),
        "merge": _merge_parser(base),
    }
    for parser in phases.values():
        logs.add_global_arguments(parser)

    class ConvertParser(base):
        # argparse calls a subcommand's parser with the words after the subcommand's name.
        def parse_known_args(self, args=None, namespace=None):
            if args and args[0] in phases:
                return phases[args[0]].parse_known_args(args[1:], namespace)
            return super().parse_known_args(args, namespace)

    convert_parser.__class__ = ConvertParser


def _parser(base, phase: str, description: str, epilog: str | None = None):
    return base(
        prog=f"shardtok convert {phase}",
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def _output(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--output",
        "-o",
        required=True,
        metavar="DIR",
        help="the dataset folder or object-store prefix (s3://bucket/prefix/) of the plan",
    )


def _plan_parser(base, add_arguments, options):
    p = _parser(base, "plan", PLAN_DESCRIPTION, SLURM_EPILOG)
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="files, folders or glob patterns")
    _output(p)
    add_arguments(p)
    p.set_defaults(run=functools.partial(run_plan, options=options))
    return p


def _run_units_parser(base):
    p = _parser(base, "run-units", RUN_UNITS_DESCRIPTION, SLURM_EPILOG)
    _output(p)
    p.add_argument(
        "--rank", type=at_least(0), required=True, metavar="R", help="this task's rank, 0..W-1"
    )
    p.add_argument(
        "--world-size",
        type=at_least(1),
        required=True,
        metavar="W",
        help="how many ranks share the units",
    )
    p.add_argument(
        "--workers",
        type=at_least(0),
        default=0,
        metavar="N",
        help="tokenizer processes on this machine (default: number of cores)",
    )
    p.set_defaults(run=run_run_units)
    return p


def _status_parser(base):
    p = _parser(base, "status", STATUS_DESCRIPTION)
    _output(p)
    p.add_argument(
        "--json",
        action="store_true",
        help="print the counts as one JSON object (output, units, done, failed, missing, "
        "complete, merged, failure, failure_unit, first_missing, exit_code)",
    )
    p.set_defaults(run=run_status)
    return p


def _merge_parser(base):
    p = _parser(base, "merge", MERGE_DESCRIPTION)
    _output(p)
    p.add_argument(
        "--jobs",
        type=at_least(1),
        default=None,
        metavar="N",
        help="processes writing shards (default: number of cores)",
    )
    p.add_argument(
        "--keep-work",
        action="store_true",
        help="keep OUTPUT/.shardtok-work/ (the units and the plan) after the merge",
    )
    p.set_defaults(run=run_merge)
    return p


def run_plan(args: argparse.Namespace, options) -> int:
    from shardtok.convert.job.phases import plan

    job, run = options(args)
    summary = plan(job, run)
    if not logs.options(args).quiet:
        print(summary.summary())
        if job.sft is None:  # the plan fixes the special tokens: say which, as convert does
            print(job.tokenizer.special_tokens_summary())
    return 0


def run_run_units(args: argparse.Namespace) -> int:
    from shardtok.convert.engines.ranks import run_units
    from shardtok.errors import ShardtokError, UsageError

    if args.rank >= args.world_size:
        raise UsageError(
            f"--rank {args.rank} is outside --world-size {args.world_size} (ranks are 0.."
            f"{args.world_size - 1})"
        )
    switches = logs.options(args)
    summary = run_units(
        args.output,
        args.rank,
        args.world_size,
        workers=args.workers,
        progress=switches.progress,
        storage_options=storage_args.client_options(args, [args.output]),
    )
    if not switches.quiet:
        print(summary.summary())
    if summary.failure is not None:
        raise ShardtokError(summary.failure)
    return 0


def run_status(args: argparse.Namespace) -> int:
    from shardtok.convert.job.unit_status import status

    found = status(args.output, storage_args.client_options(args, [args.output]))
    if args.json:
        print(json.dumps(found.to_json(), ensure_ascii=False))
    else:
        print(found.summary())
    return found.exit_code


def run_merge(args: argparse.Namespace) -> int:
    from shardtok.convert.job.phases import merge

    switches = logs.options(args)
    result = merge(
        args.output,
        jobs=args.jobs,
        keep_work=args.keep_work,
        progress=switches.progress,
        storage_options=storage_args.client_options(args, [args.output]),
    )
    if not switches.quiet:
        lines = result.summary().splitlines()
        if not result.already_complete:
            lines[0] = (
                f"merged {result.units_total:,} work units in {result.seconds:.1f} s into {result.output}"
            )
            lines = [line for line in lines if not line.startswith("  work units")]
        print("\n".join(lines), file=sys.stdout)
    return 0
