"""`shardtok convert` and `shardtok sample-corpus`: argparse wiring for the conversion layer.

Each subcommand is an ``add_*parser(subparsers)`` that sets ``run`` as the parser default and a
``run*(args) -> int``; shardtok/cli/main.py mounts them and turns ShardtokError into exit status 1.
"""

from __future__ import annotations

import argparse
import sys

from shardtok.cli import convert_phases, logs, storage_args
from shardtok.cli.arguments import at_least, parse_compression, parse_size
from shardtok.convert.inputs.sample_corpus import write_sample_corpus
from shardtok.convert.tokenizing.tokenizer import BUNDLED, BUNDLED_NAME

CONVERT_DESCRIPTION = """\
Tokenize raw text into a shardtok dataset: tar shards with Megatron-compatible indices and
zstd-compressed tokens, plus index.json.

Inputs are JSONL (.jsonl/.json/.ndjson, one object per line, optionally .gz or .zst), Parquet
(.parquet), Arrow (.arrow, and the folders Hugging Face datasets' save_to_disk writes: convert
saved/train) and plain text (.txt: one document per file, or per line with --txt-mode lines),
given as files, folders or glob patterns, in any mix. The input is cut into work units that --workers
processes tokenize in parallel; the output bytes are the same for any worker count.

If the run is interrupted (Ctrl-C, kill, crash), run the same command again: finished work units
are kept in OUTPUT/.shardtok-work/ and reused, and the result is byte-identical to an
uninterrupted run.

Across machines, the same conversion runs as phases that any scheduler can drive (see
`shardtok convert plan --help`), or all at once on a dask cluster with --engine dask:
  shardtok convert plan INPUT... -o OUT [options]            write the plan of work units
  shardtok convert run-units -o OUT --rank R --world-size W  units i = R (mod W); rerun freely
  shardtok convert status -o OUT                             exit 0 only when every unit is done
  shardtok convert merge -o OUT                              shards, rejects.jsonl, index.json
The output is the same bytes whatever ran it. An input file literally named plan, run-units,
status or merge must be given as ./plan (the first word picks the phase).
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

on a dask cluster (pip install 'shardtok[dask]'): --engine dask starts a cluster of --workers
processes on this machine, or uses the one at --scheduler tcp://HOST:PORT, whose workers must
reach the inputs and --output (a shared file system, or an object store such as s3://).
  shardtok convert 'crawl/*.jsonl.zst' -o s3://bucket/data/ --engine dask --scheduler tcp://head:8786

fine-tuning data (--sft-format, or --sft CONFIG.yaml): chat or instruction records (sharegpt,
openai, alpaca, prompt_completion, or the jq patterns of a reference-style YAML) are rendered
with a chat template and stored with a loss mask per token (1 = trained); see docs/SFT.md. The
flags describe the simple case; a YAML adds column and role maps (the flags override it).
  shardtok convert chats.jsonl --output sft/ --tokenizer ./llama3/ --sft-format openai --chat-template llama3
  shardtok convert alpaca.jsonl --output sft/ --sft-format alpaca --max-tokens 2048
  shardtok convert chats.jsonl --output sft/ --tokenizer ./qwen3/ --sft sft.yaml
"""


def _given(action: type[argparse.Action]) -> type[argparse.Action]:
    """`action` that also notes its option in ``namespace.given``: --sft refuses some options
    when given, not when left at defaults that plain conversions need (--append-eos is on)."""

    class Given(action):
        def __call__(self, parser, namespace, values, option_string=None):
            super().__call__(parser, namespace, values, option_string)
            given = getattr(namespace, "given", None) or set()
            namespace.given = given | {option_string}

    return Given


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "convert",
        help="tokenize JSONL/Parquet/txt corpora into shards (parallel, resumable; phases for "
        "many machines)",
        description=CONVERT_DESCRIPTION,
        epilog=CONVERT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="files, folders or glob patterns")
    p.add_argument("--output", "-o", required=True, metavar="DIR", help="dataset folder to write")
    add_conversion_arguments(p)
    p.add_argument(
        "--workers",
        type=at_least(0),
        default=0,
        metavar="N",
        help="tokenizer processes (default: number of cores); with --engine dask and no "
        "--scheduler, the local cluster's worker processes",
    )
    p.add_argument(
        "--keep-work",
        action="store_true",
        help="keep OUTPUT/.shardtok-work/ (the per-unit tokens) after success",
    )
    p.add_argument(
        "--engine",
        choices=("local", "dask"),
        default="local",
        help="local: this machine's processes (default); dask: a dask cluster runs every phase "
        "(needs pip install 'shardtok[dask]')",
    )
    p.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="with --engine dask: the scheduler to use (tcp://HOST:PORT); default: a local "
        "cluster of --workers processes",
    )
    p.set_defaults(run=run)
    # Here rather than only in main: the convert parser is also used on its own.
    logs.add_global_arguments(p)
    convert_phases.mount(p, add_conversion_arguments, conversion_job)
    return p


def add_conversion_arguments(p: argparse.ArgumentParser) -> None:
    """The options that decide what a conversion writes (shared by convert and convert plan)."""
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
        action=_given(argparse._StoreAction),
        metavar="KEY",
        help="JSON/Parquet/Arrow field holding the text; a.b.c reaches nested fields (default text; "
        "with --sft the YAML's column_map names the fields)",
    )
    p.add_argument(
        "--txt-mode",
        choices=("file", "lines"),
        default="file",
        help=".txt inputs: one document per file (default) or per non-blank line",
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
        action=_given(argparse.BooleanOptionalAction),
        default=True,
        help="append the EOS token (the tokenizer's eos_token, or --eos-token) to every document "
        "(default on; refused with --sft, where the chat template decides)",
    )
    p.add_argument(
        "--prepend-bos",
        action=_given(argparse._StoreTrueAction),
        help="put the BOS token (the tokenizer's bos_token, or --bos-token) before every "
        "document (default off; refused with --sft)",
    )
    p.add_argument(
        "--eos-token",
        metavar="TOKEN",
        help="the EOS token to append, overriding the tokenizer's eos_token (default: "
        "eos_token from tokenizer_config.json or special_tokens_map.json; a bare "
        "tokenizer.json: its first special token named <|endoftext|>, <|end_of_text|>, </s>, "
        "<eos>, ...); e.g. --eos-token '<|endoftext|>' for a Qwen chat tokenizer, whose "
        "eos_token <|im_end|> ends a chat turn. The summary names the token used",
    )
    p.add_argument(
        "--bos-token",
        metavar="TOKEN",
        help="the BOS token for --prepend-bos, overriding the tokenizer's bos_token (default: "
        "bos_token from the tokenizer's configuration; a bare tokenizer.json: its first "
        "special token named <|begin_of_text|>, <s>, <bos>, ...)",
    )
    p.add_argument(
        "--name", default="shard", help="shard file prefix: NAME-000000.tar ... (default shard)"
    )
    p.add_argument(
        "--unit-size",
        type=parse_size,
        default=None,
        metavar="SIZE",
        help="input bytes per work unit (default: total/64, between 256KiB and 16MiB; for the "
        "phases and --engine dask up to 256MiB, about total/10,000, for corpora over ~160GB); "
        "a frame never spans two units, so it moves frame boundaries (documents and tokens "
        "stay the same)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a dataset or unfinished conversion already in --output",
    )
    _add_sft_arguments(p)


def _add_sft_arguments(p: argparse.ArgumentParser) -> None:
    from shardtok.convert.sft.config import FORMATS, TRUNCATIONS

    g = p.add_argument_group("fine-tuning data (see docs/SFT.md)")
    g.add_argument(
        "--sft",
        metavar="CONFIG.yaml",
        help="records are chats or instructions: render them as CONFIG.yaml says and store a "
        "loss mask per token; the options below override the YAML, or alone (with "
        "--sft-format) describe the records without one",
    )
    g.add_argument("--sft-format", choices=FORMATS, help="the records' format")
    g.add_argument(
        "--chat-template",
        metavar="NAME|PATH",
        help="tokenizer (its own chat template), a built-in (chatml, llama3, qwen3, alpaca, "
        "raw) or a Jinja file with generation blocks",
    )
    g.add_argument(
        "--train-on-input",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="train on every rendered token, prompts included (YAML default: off)",
    )
    g.add_argument("--max-tokens", type=at_least(1), metavar="N", help="longest record, in tokens")
    g.add_argument(
        "--truncation",
        choices=TRUNCATIONS,
        help="a record over --max-tokens: drop it (bad record too_long), drop trailing turns, "
        "or keep its start",
    )


def _sft_setup(args: argparse.Namespace):
    """The --sft config with its overrides, or the fine-tuning flags alone (read before the
    tokenizer: its mistakes come first); refuses what does not apply."""
    from shardtok.convert.sft.config import load_sft_config
    from shardtok.errors import UsageError

    overrides = {
        "format": args.sft_format,
        "template": args.chat_template,
        "train_on_input": args.train_on_input,
        "max_tokens": args.max_tokens,
        "truncation": args.truncation,
    }
    if args.sft is None and all(v is None for v in overrides.values()):
        return None  # text documents
    given = getattr(args, "given", None) or set()
    refused = [f for f in ("--append-eos", "--prepend-bos") if f in given]
    if refused:
        raise UsageError(
            f"{refused[0]} does not apply to fine-tuning data: the chat template decides BOS/EOS"
        )
    if "--text-key" in given:
        raise UsageError(
            "--text-key does not apply to fine-tuning data: name fields in an --sft YAML's "
            "column_map"
        )
    return load_sft_config(args.sft, overrides)


def conversion_job(args: argparse.Namespace):
    """The ConvertJob the arguments describe (the tokenizer and the fine-tuning setup loaded and
    checked), and the RunOptions of this process."""
    from shardtok.convert.job.spec import ConvertJob, RunOptions
    from shardtok.convert.tokenizing.tokenizer import BUNDLED_PATH, load_tokenizer

    sft_config = _sft_setup(args)
    switches = logs.options(args)
    if args.tokenizer == BUNDLED and not switches.quiet:
        print(
            f"note: using the bundled demo tokenizer {BUNDLED_NAME} (pass --tokenizer for your model's)",
            file=sys.stderr,
        )
    spec = load_tokenizer(
        args.tokenizer,
        append_eos=args.append_eos and sft_config is None,
        prepend_bos=args.prepend_bos,
        eos_token=args.eos_token,
        bos_token=args.bos_token,
        backend=args.tokenizer_backend,
        cache_dir=args.cache_dir,
    )
    if spec.eos_note and not switches.quiet:
        print(spec.eos_note, file=sys.stderr)
    sft = None
    if sft_config is not None:
        from shardtok.convert.sft.setup import prepare_sft

        path = BUNDLED_PATH if args.tokenizer == BUNDLED else args.tokenizer
        sft = prepare_sft(sft_config, spec, path)
    job = ConvertJob(
        inputs=tuple(args.inputs),
        output=args.output,
        tokenizer=spec,
        sft=sft,
        text_key=args.text_key,
        txt_mode=args.txt_mode,
        on_bad_record=args.on_bad_record,
        shard_size=args.shard_size,
        compression_level=args.compression_level,
        frame_size=args.frame_size,
        unit_size=args.unit_size,
        name=args.name,
    )
    run = RunOptions(
        workers=getattr(args, "workers", 0) or 0,
        keep_work=getattr(args, "keep_work", False),
        overwrite=args.overwrite,
        progress=switches.progress,
        storage_options=storage_args.client_options(args, [*args.inputs, args.output]),
    )
    return job, run


def run(args: argparse.Namespace) -> int:
    from shardtok.convert.engines.local import convert
    from shardtok.errors import UsageError

    if args.scheduler is not None and args.engine != "dask":
        raise UsageError("--scheduler applies to --engine dask only")
    if args.engine == "dask":
        from shardtok.convert.engines.dask import require_dask

        require_dask()  # before the tokenizer is loaded: the mistake comes first
    job, run_options = conversion_job(args)
    if args.engine == "dask":
        from shardtok.convert.engines.dask import convert_with_dask

        result = convert_with_dask(job, run_options, scheduler=args.scheduler)
    else:
        result = convert(job, run_options)
    if not logs.options(args).quiet:
        print(result.summary())
        if job.sft is None:  # with fine-tuning data the chat template places BOS/EOS
            print(job.tokenizer.special_tokens_summary())
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
        epilog=(
            "examples:\n"
            "  shardtok sample-corpus corpus.jsonl && shardtok convert corpus.jsonl --output data/\n"
            "  shardtok sample-corpus --chat chat.jsonl && "
            "shardtok convert chat.jsonl --output chat/ --sft docs/sft/chat.yaml"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("output", metavar="OUT.jsonl", help="file to write")
    p.add_argument(
        "--chat",
        action="store_true",
        help='write chat records instead ({"messages": [...]}, the openai SFT format): a user '
        "asks what a stdlib name does, the assistant answers with its docstring, sometimes a "
        "follow-up turn and a system message",
    )
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
    records, nbytes = write_sample_corpus(args.output, args.max_size, chat=args.chat)
    kind = "conversations" if args.chat else "documents"
    print(f"wrote {records:,} {kind} ({nbytes:,} bytes) to {args.output}")
    return 0
