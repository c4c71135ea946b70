"""The `shardtok` command line: one subcommand per module, `main(argv=None) -> int`.

This package is the only place that imports the conversion layer and the torch adapters
together; each command module imports its layer when it runs.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys

from shardtok import __version__
from shardtok.cli import convert, inspect, logs, megatron, stream, trace, verify
from shardtok.errors import ShardtokError, UsageError
from shardtok.storage.endpoints import describe as describe_unreachable

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
  shardtok trace data/ --seq-len 2048 --batch-size 8 --num-workers 0 --step 100   # its documents
  shardtok export-megatron data/ out/corpus_text_document   # a .bin/.idx pair for Megatron-LM

every command takes the options below, before or after its name (shardtok -v stream ... or
shardtok stream ... -v); see docs/CLI.md.

exit status: 0 success; 1 bad data, a file or the network; 2 an option or argument that cannot
work; 3 `convert status`: units still to do; 130 interrupted; 141 the reader of the output left.
"""


class _Parser(argparse.ArgumentParser):
    """argparse with its errors on one line: the mistake, then where the help is."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="shardtok",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"shardtok {__version__}")
    logs.add_global_arguments(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in _SUBCOMMANDS:
        add(sub)
    for command in sub.choices.values():
        logs.add_global_arguments(command)  # a no-op for those that added the group themselves
    parser.commands = sub.choices  # type: ignore[attr-defined]
    return parser


_SUBCOMMANDS = [
    convert.add_parser,
    convert.add_sample_corpus_parser,
    stream.add_parser,
    trace.add_parser,
    inspect.add_parser,
    verify.add_parser,
    megatron.add_import_parser,
    megatron.add_export_parser,
]

EXIT_DATA = 1  # the data, a file or the network failed
EXIT_USAGE = 2  # an option or argument cannot work (argparse's own status for its errors)
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what `yes | head` leaves behind


def _parse(argv: list[str] | None) -> tuple[argparse.Namespace, bool]:
    argv = list(sys.argv[1:] if argv is None else argv)
    # --traceback is a debugging switch for any command, so it may stand anywhere.
    traceback_wanted = "--traceback" in argv
    argv = [a for a in argv if a != "--traceback"]
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        _refuse_unknown(parser, args, unknown)
    if not getattr(args, "run", None):
        parser.print_help()
        raise SystemExit(EXIT_USAGE)
    return args, traceback_wanted


def _refuse_unknown(parser: argparse.ArgumentParser, args, unknown: list[str]):
    """argparse's "unrecognized arguments", said by the command that was given them (its
    prog and its --help) and with the option each misspelt one probably meant."""
    command = getattr(parser, "commands", {}).get(getattr(args, "command", None))
    owner = command or parser
    known = [
        option
        for each in {id(p): p for p in (parser, owner)}.values()
        for action in each._actions
        for option in action.option_strings
        if option.startswith("--")
    ]
    guesses = [(word, _closest(word, known)) for word in unknown]
    guesses = [(word, guess) for word, guess in guesses if guess is not None]
    hint = ""
    if len(guesses) == 1:
        hint = f" (did you mean {guesses[0][1]}?)"
    elif guesses:
        pairs = ", ".join(f"{guess} for {word.split('=', 1)[0]}" for word, guess in guesses)
        hint = f" (did you mean {pairs}?)"
    owner.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")


def _closest(word: str, known: list[str]) -> str | None:
    """The known option `word` (an unknown argument) most likely misspells, if any: underscores
    are the commonest slip (``--seq_len``, as the Python API spells it), then typos."""
    name = word.split("=", 1)[0]
    if not name.startswith("-") or len(name) < 3 or name[1:].replace(".", "").isdigit():
        return None  # a value or a short option: nothing worth guessing
    wanted = "--" + name.lstrip("-").replace("_", "-").lower()
    if wanted in known:
        return wanted
    close = difflib.get_close_matches(wanted, known, n=1, cutoff=0.75)
    return close[0] if close else None


def run(argv: list[str] | None = None) -> int:
    """Parse and run one command, letting its errors propagate (``main`` reports them)."""
    args, _ = _parse(argv)
    with logs.logging_to_stderr(logs.options(args)):
        return int(args.run(args) or 0)


def main(argv: list[str] | None = None) -> int:
    """The `shardtok` command. A user's mistake or bad data is one line on stderr, never a
    traceback: exit 2 for an option that cannot work, 1 for data, files or the network, 130 when
    interrupted, 141 when the reader of our output went away (``| head``); ``--traceback``
    shows the full trace."""
    try:
        args, traceback_wanted = _parse(argv)
    except KeyboardInterrupt:  # no command yet, so nothing to resume
        print("shardtok: interrupted", file=sys.stderr)
        return 130
    name = f"shardtok {args.command}"
    try:
        with logs.logging_to_stderr(logs.options(args)):
            return int(args.run(args) or 0)
    except KeyboardInterrupt:
        hint = (
            " (run the same command again to resume: finished work units are kept)"
            if args.command == "convert"
            else ""
        )
        print(f"{name}: interrupted{hint}", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # Nothing is wrong; Python would still complain when it flushes stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except Exception as exc:
        if traceback_wanted:
            raise
        print(f"{name}: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, UsageError) else EXIT_DATA


def _one_line(exc: BaseException) -> str:
    # A storage client's own error for a refused connection or an unknown host (ours would be a
    # StorageError already): which endpoint, and what to check, rather than "a bug".
    unreachable = None if isinstance(exc, ShardtokError) else describe_unreachable(exc)
    if isinstance(exc, ShardtokError):
        text = str(exc)
    elif unreachable is not None:
        text = unreachable
    elif isinstance(exc, OSError) and exc.strerror:
        where = f"{exc.filename}: " if exc.filename is not None else ""
        text = f"{where}{exc.strerror}"
    else:  # not ours on purpose: say what it is, and how to report it
        text = (
            f"{type(exc).__name__}: {exc} (this looks like a bug in shardtok: run again with "
            "--traceback and report the trace)"
        )
    return " ".join(text.split())


if __name__ == "__main__":
    sys.exit(main())
