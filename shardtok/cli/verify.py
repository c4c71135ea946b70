"""`shardtok verify`: every checksum, frame and index invariant of a dataset or shard."""

from __future__ import annotations

import argparse

from shardtok.cli.paths import TARGET_HELP, target
from shardtok.format.manifest import MANIFEST_NAME


def add_parser(sub) -> None:
    p = sub.add_parser(
        "verify",
        help="check every checksum, frame and index invariant",
        description=(
            "Decode every frame of every shard and compare it with the zstd checksums, the per-frame crc32, "
            "the .bin sha256, the index and the manifest. Lists every bad shard; exit status 0 only when all pass. "
            "Given some shards of a dataset (a pattern, a glob or several files), checks those only, "
            "against the dataset's index.json."
        ),
        epilog="examples:\n  shardtok verify data/ && echo intact\n"
        "  shardtok verify 'data/shard-{000000..000009}.tar'   # these 10 shards only",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("path", nargs="+", metavar="PATH", help=TARGET_HELP)
    p.set_defaults(run=run)


def run(args) -> int:
    from shardtok.cli import logs
    from shardtok.cli.storage_args import retry_policy
    from shardtok.dataset.source import DatasetSource
    from shardtok.format.verify import VerifyReport, verify_dataset, verify_shard
    from shardtok.storage import Location, open_source
    from shardtok.stream.factory import use_retry

    retry = retry_policy(args)  # --max-attempts, --timeout

    def opener(where: Location):
        # The stream keeps what it reads from (a file, or the remote source), so the source
        # object itself need not outlive this call.
        return lambda: open_source(where, retry=retry).open_stream()

    chosen, shown = target(args.path)
    subset = ""
    if isinstance(chosen, DatasetSource):
        dataset = chosen
        use_retry(dataset, retry)
        if dataset.shards is not None:  # names not in index.json: refused here, one line
            listed = len(dataset.dataset_manifest.shards)
            subset = f" (a subset: {len(dataset.manifest.shards)} of the {listed} shards"
            subset += f" {dataset.where_of(MANIFEST_NAME)} lists)"
        compact: list[str] = []  # index.compact's problems: the shards are still checked
        report = verify_dataset(
            # index.json whole, index.compact checked against it
            lambda: dataset.verified_manifest(on_problem=compact.append),
            lambda name: opener(dataset.root.join(name)),
            dataset.where_of,
        )
        report.errors[:0] = compact
    else:
        report = VerifyReport(shards=[verify_shard(opener(chosen), shown)])
    for error in report.errors:
        print(f"BAD  {error}")
    for shard in report.shards:
        if not shard.ok:
            print(f"BAD  {shard.error}")
        elif not logs.options(args).quiet:  # -q: print only problems
            print(
                f"ok   {shard.file}: {shard.num_documents:,} documents, {shard.num_tokens:,} tokens"
            )
    bad = len(report.bad_shards) + len(report.errors)
    print(
        f"{len(report.shards) - len(report.bad_shards)} of {len(report.shards)} shards ok"
        + (f", {bad} problem(s)" if bad else "")
        + subset
    )
    return 0 if report.ok else 1
