"""`shardtok inspect`: counts, dtype, tokenizer, frames and compression of a dataset or shard."""

from __future__ import annotations

import argparse
import json

from shardtok.cli.paths import is_dataset, label, locate


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
    from shardtok.format.inspect import format_summary, inspect_dataset, inspect_shard
    from shardtok.storage import open_source
    from shardtok.storage.dataset import DatasetSource

    where = locate(args.path)
    if is_dataset(where):
        dataset = DatasetSource(where.url)
        summary = inspect_dataset(
            dataset.manifest, dataset.open_file, label(where), dataset.where_of
        )
    else:
        summary = inspect_shard(open_source(where), label(where))
    print(json.dumps(summary, indent=1, sort_keys=True) if args.json else format_summary(summary))
    return 0
