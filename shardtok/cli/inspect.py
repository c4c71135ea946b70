"""`shardtok inspect`: counts, dtype, tokenizer, frames and compression of a dataset or shard."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


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
    from shardtok.storage import Location, open_source
    from shardtok.storage.dataset import DatasetSource

    where = Location.of(args.path)
    if _is_dataset(where):
        dataset = DatasetSource(where.url)
        summary = inspect_dataset(
            dataset.manifest, dataset.open_file, _label(where), dataset.where_of
        )
    else:
        summary = inspect_shard(open_source(where), _label(where))
    print(json.dumps(summary, indent=1, sort_keys=True) if args.json else format_summary(summary))
    return 0


def _is_dataset(where) -> bool:
    """A local folder, or a remote prefix (any URL not naming a .tar file)."""
    if where.is_local:
        return Path(where.local_path).is_dir()
    return not where.name.endswith(".tar")


def _label(where) -> str:
    # Local paths print as pathlib writes them ("data/" -> "data"), as they always have.
    return str(Path(where.local_path)) if where.is_local else where.display
