"""`shardtok inspect`: counts, dtype, tokenizer, frames and compression of a dataset or shard."""

from __future__ import annotations

import argparse
import json

from shardtok.cli.paths import TARGET_HELP, targets


def add_parser(sub) -> None:
    p = sub.add_parser(
        "inspect",
        help="summarize dataset folders, some shards of a dataset, or one shard",
        description="Print counts, dtype, tokenizer, frames, document-length percentiles, the "
        "compression ratio and the dataset's manifests (index.json, and index.compact checked "
        "against it: exit status 1 when they disagree). For some shards of a dataset (a pattern, a glob or several files) the "
        "counts are those shards'. Several dataset folders are summarized one after another.",
        epilog="examples:\n  shardtok inspect data/\n  shardtok inspect data/shard-000000.tar --json\n"
        "  shardtok inspect 'data/shard-{000000..000003}.tar'   # 4 shards, checked against "
        "index.json\n  shardtok inspect 'data/shard-*.tar'",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("path", nargs="+", metavar="PATH", help=TARGET_HELP)
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(run=run)


def run(args) -> int:
    from shardtok.cli.storage_args import retry_policy
    from shardtok.dataset.source import DatasetSource
    from shardtok.format.compact_manifest import COMPACT_NAME
    from shardtok.format.inspect import format_summary, inspect_dataset, inspect_shard
    from shardtok.storage import open_source
    from shardtok.stream.factory import use_retry

    retry = retry_policy(args)  # --max-attempts, --timeout
    summaries = []
    for chosen, shown in targets(args.path):  # all located first: a typo fails before output
        if isinstance(chosen, DatasetSource):
            use_retry(chosen, retry)
            manifest = chosen.manifest  # a subset's view: its shards, its counts
            subset = None if chosen.shards is None else len(chosen.dataset_manifest.shards)
            summary = inspect_dataset(
                manifest, chosen.open_file, shown, chosen.where_of, dataset_shards=subset
            )
            # index.json, and index.compact checked by it
            summary["manifests"] = chosen.manifests()
        else:
            summary = inspect_shard(open_source(chosen, retry=retry), shown)
        summaries.append(summary)
    if args.json:  # one target: its summary, as ever; several: a list of them
        print(json.dumps(summaries[0] if len(summaries) == 1 else summaries, indent=1,
                         sort_keys=True))  # fmt: skip
    else:
        print("\n\n".join(format_summary(summary) for summary in summaries))
    compacts = [s.get("manifests", {}).get(COMPACT_NAME) for s in summaries]
    return 1 if any(c is not None and not c["agrees"] for c in compacts) else 0
