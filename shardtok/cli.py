"""The `shardtok` command line: one subcommand per job, `main(argv=None) -> int`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from shardtok import __version__
from shardtok.convert import cli as convert_cli
from shardtok.convert.cli import parse_compression, parse_size
from shardtok.errors import ShardtokError
from shardtok.stream import cli as stream_cli

DESCRIPTION = """\
shardtok turns raw corpora into tokenized, zstd-compressed tar shards whose indices are
byte-compatible with Megatron's MMIDIDX format, and streams them into PyTorch as packed
training sequences.

typical session:
  shardtok sample-corpus corpus.jsonl                   # a few MB of real text to play with
  shardtok convert corpus.jsonl --output data/          # tokenize into shards (bundled tokenizer)
  shardtok inspect data/                                # counts, dtype, tokenizer, compression
  shardtok verify data/                                 # every checksum; exit 1 on damage
  shardtok stream data/ --seq-len 2048 --batch-size 8   # the batches a rank would train on
  shardtok export-megatron data/ out/corpus_text_document   # a .bin/.idx pair for Megatron-LM
"""


def _add_writer_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--shard-size",
        type=parse_size,
        default="64MiB",
        help="stored bytes per shard before rolling over (default 64MiB)",
    )
    parser.add_argument(
        "--compression-level",
        type=parse_compression,
        default=3,
        help="zstd level 1-22, or 0 to store the .bin uncompressed (memory-mappable in place); default 3",
    )


# -- inspect ---------------------------------------------------------------------------------


def _add_inspect(sub) -> None:
    p = sub.add_parser(
        "inspect",
        help="summarize a dataset folder or one shard",
        description="Print counts, dtype, tokenizer, frames, document-length percentiles and the compression ratio.",
        epilog="example:\n  shardtok inspect data/\n  shardtok inspect data/shard-000000.tar --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("path", help="a dataset folder (with index.json) or a .tar shard")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(run=_run_inspect)


def _run_inspect(args) -> int:
    from shardtok.format.inspect import format_summary, inspect_path

    summary = inspect_path(args.path)
    print(json.dumps(summary, indent=1, sort_keys=True) if args.json else format_summary(summary))
    return 0


# -- verify ----------------------------------------------------------------------------------


def _add_verify(sub) -> None:
    p = sub.add_parser(
        "verify",
        help="check every checksum, frame and index invariant",
        description=(
            "Decode every frame of every shard and compare it with the zstd checksums, the per-frame crc32, "
            "the .bin sha256, the index and the manifest. Lists every bad shard; exit status 0 only when all pass."
        ),
        epilog="example:\n  shardtok verify data/ && echo intact",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("path", help="a dataset folder or a .tar shard")
    p.add_argument("--quiet", action="store_true", help="print only problems")
    p.set_defaults(run=_run_verify)


def _run_verify(args) -> int:
    from shardtok.format.verify import VerifyReport, verify_dataset, verify_shard

    path = Path(args.path)
    if path.is_dir():
        report = verify_dataset(path)
    else:
        report = VerifyReport(shards=[verify_shard(path)])
    for error in report.errors:
        print(f"BAD  {error}")
    for shard in report.shards:
        if not shard.ok:
            print(f"BAD  {shard.error}")
        elif not args.quiet:
            print(
                f"ok   {shard.file}: {shard.num_documents:,} documents, {shard.num_tokens:,} tokens"
            )
    bad = len(report.bad_shards) + len(report.errors)
    print(
        f"{len(report.shards) - len(report.bad_shards)} of {len(report.shards)} shards ok"
        + (f", {bad} problem(s)" if bad else "")
    )
    return 0 if report.ok else 1


# -- Megatron import / export ----------------------------------------------------------------


def _add_import_megatron(sub) -> None:
    p = sub.add_parser(
        "import-megatron",
        help="turn a Megatron .bin/.idx pair into shards",
        description="Read PREFIX.bin and PREFIX.idx and write a shardtok dataset, one document per Megatron sequence.",
        epilog="example:\n  shardtok import-megatron corpus_text_document data/ --vocab-size 128256",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("prefix", help="path of the pair without .bin/.idx")
    p.add_argument("out_dir", help="output dataset folder")
    p.add_argument(
        "--vocab-size", type=int, help="tokenizer vocabulary size (default: largest token id + 1)"
    )
    p.add_argument("--tokenizer-name", help="recorded in the metadata")
    _add_writer_options(p)
    p.set_defaults(run=_run_import_megatron)


def _run_import_megatron(args) -> int:
    from shardtok.format.megatron_io import import_megatron

    tokenizer = {"name": args.tokenizer_name} if args.tokenizer_name else None
    manifest = import_megatron(
        args.prefix,
        args.out_dir,
        vocab_size=args.vocab_size,
        tokenizer=tokenizer,
        shard_size=args.shard_size,
        compression_level=args.compression_level,
    )
    print(
        f"wrote {len(manifest.shards)} shards, {manifest.num_documents:,} documents, {manifest.num_tokens:,} tokens to {args.out_dir}"
    )
    return 0


def _add_export_megatron(sub) -> None:
    p = sub.add_parser(
        "export-megatron",
        help="merge a dataset into one Megatron .bin/.idx pair",
        description="Write OUT_PREFIX.bin and OUT_PREFIX.idx exactly as megatron-core's IndexedDatasetBuilder would.",
        epilog="example:\n  shardtok export-megatron data/ megatron/corpus_text_document",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("dataset", help="dataset folder")
    p.add_argument("out_prefix", help="output path without .bin/.idx")
    p.set_defaults(run=_run_export_megatron)


def _run_export_megatron(args) -> int:
    from shardtok.format.megatron_io import export_megatron

    Path(args.out_prefix).parent.mkdir(parents=True, exist_ok=True)
    docs, tokens = export_megatron(args.dataset, args.out_prefix)
    print(
        f"wrote {args.out_prefix}.bin and {args.out_prefix}.idx: {docs:,} documents, {tokens:,} tokens"
    )
    return 0


# -- entry point -----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shardtok",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"shardtok {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in _SUBCOMMANDS:
        add(sub)
    return parser


_SUBCOMMANDS = [
    convert_cli.add_parser,
    convert_cli.add_sample_corpus_parser,
    stream_cli.add_parser,
    _add_inspect,
    _add_verify,
    _add_import_megatron,
    _add_export_megatron,
]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except ShardtokError as exc:
        print(f"shardtok {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        hint = (
            " (run the same command again to resume: finished work units are kept)"
            if args.command == "convert"
            else ""
        )
        print(f"shardtok {args.command}: interrupted{hint}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
