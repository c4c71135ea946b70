"""`shardtok inspect`: counts, dtype, tokenizer, frames and compression of a dataset or shard."""

from __future__ import annotations

import argparse
import json


def add_parser(sub) -> None:
    p = sub.add_parser(
        "inspect",
        help="summarize a dataset folder or one shard",
        description="Print counts, dtype, tokenizer, frames, document-length percentiles and the compression ratio.",
        epilog="example:\n  shardtok inspect data/\n  shardtok inspect data/shard-000000.tar --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("path", help="a dataset folder (with index.json) or a .tar shard")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(run=run)


def run(args) -> int:
    from shardtok.format.inspect import format_summary, inspect_path

    summary = inspect_path(args.path)
    print(json.dumps(summary, indent=1, sort_keys=True) if args.json else format_summary(summary))
    return 0
