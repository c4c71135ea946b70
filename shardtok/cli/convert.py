"""`shardtok convert` and `shardtok sample-corpus`: argparse wiring for the conversion layer.

Each subcommand is an ``add_*parser(subparsers)`` that sets ``run`` as the parser default and a
``run*(args) -> int``; shardtok/cli/main.py mounts them and turns ShardtokError into exit status 1.
"""

from __future__ import annotations

import argparse
import sys

from shardtok.cli.arguments import at_least, parse_compression, parse_size
from shardtok.convert.sample_corpus import write_sample_corpus
from shardtok.convert.tokenizer import BUNDLED, BUNDLED_NAME

CONVERT_DESCRIPTION = """\
Tokenize raw text into a shardtok dataset: tar shards with Megatron-compatible indices and
zstd-compressed tokens, plus index.json.

Inputs are JSONL (.jsonl/.json/.ndjson, one object per line, optionally .gz or .zst), Parquet
(.parquet) and plain text (.txt: one document per file, or per line with --txt-mode lines), given
as files, folders or glob patterns, in any mix. The input is cut into work units that --workers
processes tokenize in parallel; the output bytes are the same for any worker count.

If the run is interrupted (Ctrl-C, kill, crash), run the same command again: finished work units
are kept in OUTPUT/.shardtok-work/ and reused, and the result is byte-identical to an
uninterrupted run.
"""

CONVERT_EPILOG = """\
examples:
  shardtok sample-corpus corpus.jsonl
  shardtok convert corpus.jsonl --output data/
  shardtok convert 'crawl/*.jsonl.zst' books/ --output data/ --tokenizer ./llama3/ \\
      --text-key meta.content --workers 16 --on-bad-record skip --shard-size 256MiB

the summary names the backend that encoded (tiktoken or hf) and, for auto, why; the shards are
the same bytes either way.

bad records (invalid JSON, missing or non-string field, invalid UTF-8, empty text) stop the run
with file and line (--on-bad-record error, the default) or are skipped, counted in index.json and
listed in OUTPUT/rejects.jsonl (--on-bad-record skip).
"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "convert",
        help="tokenize JSONL/Parquet/txt corpora into shards (parallel, resumable)",
        description=CONVERT_DESCRIPTION,
        epilog=CONVERT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="files, folders or glob patterns")
    p.add_argument("--output", "-o", required=True, metavar="DIR", help="dataset folder to write")
    p.add_argument(
        "--tokenizer",
        default=BUNDLED,
        metavar="PATH",
        help="a Hugging Face tokenizer folder or tokenizer.json (local; nothing is downloaded); "
        f"default: the small bundled demo tokenizer ({BUNDLED_NAME})",
    )
    p.add_argument(
        "--tokenizer-backend",
        choices=("auto", "hf", "tiktoken"),
        default="auto",
        help="what encodes: tiktoken (4-5x faster, same ids) where the tokenizer passes the "
        "equivalence checks, else Hugging Face tokenizers (auto, the default); hf: always "
        "tokenizers; tiktoken: stop with the failed condition if it does not qualify",
    )
    p.add_argument(
        "--cache-dir",
        metavar="DIR",
        default=None,
        help="keep the tiktoken check's verdict in DIR/tiktoken-gate/ (saves ~1 s per run for "
        "a 128k vocabulary), e.g. ~/.cache/shardtok; default: no cache, nothing written",
    )
    p.add_argument(
        "--text-key",
        default="text",
        metavar="KEY",
        help="JSON/Parquet field holding the text; a.b.c reaches nested fields (default text)",
    )
    p.add_argument(
        "--txt-mode",
        choices=("file", "lines"),
        default="file",
        help=".txt inputs: one document per file (default) or per non-blank line",
    )
    p.add_argument(
        "--workers",
        type=at_least(0),
        default=0,
        metavar="N",
        help="tokenizer processes (default: number of cores)",
    )
    p.add_argument(
        "--on-bad-record",
        choices=("error", "skip"),
        default="error",
        help="stop at the first bad record (default) or skip and log it to rejects.jsonl",
    )
    p.add_argument(
        "--shard-size",
        type=parse_size,
        default="64MiB",
        metavar="SIZE",
        help="stored bytes per shard before rolling over, e.g. 64MB, 1GiB (default 64MiB)",
    )
    p.add_argument(
        "--compression-level",
        type=parse_compression,
        default=3,
        metavar="L",
        help="zstd level 1-22, or 0/none for an uncompressed, memory-mappable .bin member (default 3)",
    )
    p.add_argument(
        "--frame-size",
        type=parse_size,
        default="1MiB",
        metavar="SIZE",
        help="uncompressed token bytes per zstd frame, the unit of random access (default 1MiB)",
    )
    p.add_argument(
        "--append-eos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="append the tokenizer's EOS token to every document (default on)",
    )
    p.add_argument(
        "--prepend-bos",
        action="store_true",
        help="put the tokenizer's BOS token before every document",
    )
    p.add_argument(
        "--eos-token",
        metavar="TOKEN",
        help="EOS token to use when the tokenizer names none (e.g. a bare tokenizer.json)",
    )
    p.add_argument(
        "--bos-token", metavar="TOKEN", help="BOS token to use when the tokenizer names none"
    )
    p.add_argument(
        "--name", default="shard", help="shard file prefix: NAME-000000.tar ... (default shard)"
    )
    p.add_argument(
        "--unit-size",
        type=parse_size,
        default=None,
        metavar="SIZE",
        help="input bytes per work unit (default: total/64, between 256KiB and 16MiB); a frame never spans two units, so it moves frame boundaries (documents and tokens stay the same)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a dataset or unfinished conversion already in --output",
    )
    p.add_argument(
        "--keep-work",
        action="store_true",
        help="keep OUTPUT/.shardtok-work/ (the per-unit tokens) after success",
    )
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar and no summary")  # fmt: skip
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    from shardtok.convert.runner import ConvertOptions, convert
    from shardtok.convert.tokenizer import load_tokenizer

    if args.tokenizer == BUNDLED and not args.quiet:
        print(
            f"note: using the bundled demo tokenizer {BUNDLED_NAME} (pass --tokenizer for your model's)",
            file=sys.stderr,
        )
    spec = load_tokenizer(
        args.tokenizer,
        append_eos=args.append_eos,
        prepend_bos=args.prepend_bos,
        eos_token=args.eos_token,
        bos_token=args.bos_token,
        backend=args.tokenizer_backend,
        cache_dir=args.cache_dir,
    )
    result = convert(
        ConvertOptions(
            inputs=tuple(args.inputs),
            output=args.output,
            tokenizer=spec,
            text_key=args.text_key,
            txt_mode=args.txt_mode,
            workers=args.workers,
            on_bad_record=args.on_bad_record,
            shard_size=args.shard_size,
            compression_level=args.compression_level,
            frame_size=args.frame_size,
            unit_size=args.unit_size,
            name=args.name,
            overwrite=args.overwrite,
            keep_work=args.keep_work,
            progress=not args.quiet,
        )
    )
    if not args.quiet:
        print(result.summary())
    return 0


def add_sample_corpus_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "sample-corpus",
        help="write a few MB of real text (the Python stdlib's docstrings) as JSONL",
        description=(
            "Write every docstring of this Python's standard library as JSONL records "
            '{"text": ..., "source": "module.qualname"}: about 3 MB of real English prose and code, '
            "the same bytes on every machine with the same Python version. Handy for trying convert."
        ),
        epilog="example:\n  shardtok sample-corpus corpus.jsonl && shardtok convert corpus.jsonl --output data/",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("output", metavar="OUT.jsonl", help="file to write")
    p.add_argument(
        "--max-size",
        type=parse_size,
        default=None,
        metavar="SIZE",
        help="stop before this many bytes (default: all docstrings)",
    )
    p.set_defaults(run=run_sample_corpus)
    return p


def run_sample_corpus(args: argparse.Namespace) -> int:
    records, nbytes = write_sample_corpus(args.output, args.max_size)
    print(f"wrote {records:,} documents ({nbytes:,} bytes) to {args.output}")
    return 0
