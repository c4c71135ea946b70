"""The `shardtok` command line: one subcommand per module, `main(argv=None) -> int`.

This package is the only place that imports the conversion layer and the torch adapters
together; each command module imports its layer when it runs.
"""

from __future__ import annotations

import argparse
import sys

from shardtok import __version__
from shardtok.cli import convert, inspect, megatron, stream, verify
from shardtok.errors import ShardtokError

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
    convert.add_parser,
    convert.add_sample_corpus_parser,
    stream.add_parser,
    inspect.add_parser,
    verify.add_parser,
    megatron.add_import_parser,
    megatron.add_export_parser,
]


def run(argv: list[str] | None = None) -> int:
    """Parse and run one command, letting its errors propagate (``main`` reports them)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    return int(args.run(args) or 0)


def main(argv: list[str] | None = None) -> int:
    """The `shardtok` command: user errors become one line on stderr and exit status 1."""
    args = build_parser().parse_args(argv)
    try:
        return run(argv)
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
