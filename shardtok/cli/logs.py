"""The switches every command takes: how much it says, progress bars, storage retries.

    -v / -vv            info / debug records of the ``shardtok`` loggers on stderr
    -q / -qq            no progress, no summary, no notes / and no warnings either
    --log-level LEVEL   debug, info, warning or error (instead of counting -v and -q)
    --progress / --no-progress   a bar even when stderr is not a terminal / none at all
    --max-attempts N, --timeout SECONDS   storage retries (see shardtok.cli.storage_args)
    --read-ahead-mb MB  memory one remote shard stream may hold ahead of its reader
    --traceback         the full Python trace on an error (main strips it from the line)

Each may stand before the command (``shardtok -v stream ...``) or among its arguments: every
parser gets the same group. argparse copies a subcommand's defaults over the values parsed
before it, so the flags before the command land in their own ``top_*`` fields and
``options(args)`` merges the two.

This module is the only place that configures logging, and only for one command line run
(``logging_to_stderr``): library modules just ``logging.getLogger(__name__)``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from shardtok.cli.arguments import at_least
from shardtok.errors import UsageError
from shardtok.storage.retry import MIN_READ_AHEAD

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
LABELS = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warning"}
TOP = "top_"  # the fields of the flags given before the command
GROUP_TITLE = "options of every command (also before it: shardtok -v COMMAND ...)"
_PACKAGE = str(Path(__file__).resolve().parent.parent)


def _megabytes(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of MB, got {text!r}") from None
    if not value * (1 << 20) >= MIN_READ_AHEAD:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be at least 0.0625 (64 KiB), got {text}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return value


def add_global_arguments(parser: argparse.ArgumentParser, *, top: bool = False) -> None:
    """Add the group of switches every command takes to `parser` (`top`: the parser of
    ``shardtok`` itself). An option string the parser already has is left to it (verify's own
    ``--quiet`` means what ``-q`` means there)."""
    if getattr(parser, "_shardtok_global_options", False):
        return
    parser._shardtok_global_options = True  # type: ignore[attr-defined]
    prefix = TOP if top else ""
    taken = set(parser._option_string_actions)
    group = parser.add_argument_group(GROUP_TITLE)

    def add(*flags: str, **kwargs) -> None:
        free = [f for f in flags if f not in taken]
        if free:
            group.add_argument(*free, **kwargs)

    add(
        "-v",
        "--verbose",
        action="count",
        default=0,
        dest=prefix + "verbose",
        help="say more on stderr: -v what each phase does (info), -vv every detail (debug)",
    )
    add(
        "-q",
        "--quiet",
        action="count",
        default=0,
        dest=prefix + "quiet",
        help="no progress bar, summary or notes (warnings and errors still show); -qq: errors only",
    )
    add(
        "--log-level",
        choices=tuple(LEVELS),
        type=str.lower,
        default=None,
        metavar="LEVEL",
        dest=prefix + "log_level",
        help="the least severe records shown: debug, info, warning (default) or error",
    )
    add(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        dest=prefix + "progress",
        help="--progress: a progress bar even when stderr is not a terminal (there: a plain line "
        "every 10 s, fit for log files); --no-progress: none. Default: a bar on a terminal only",
    )
    add(
        "--max-attempts",
        type=at_least(1),
        default=None,
        metavar="N",
        dest=prefix + "max_attempts",
        help="requests per storage read before giving up, the first included (default 10)",
    )
    add(
        "--timeout",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        dest=prefix + "timeout",
        help="abandon (and retry) a storage request that receives nothing for this long "
        "(default 60)",
    )
    add(
        "--read-ahead-mb",
        type=_megabytes,
        default=None,
        metavar="MB",
        dest=prefix + "read_ahead_mb",
        help="memory one remote shard stream may hold ahead of its reader; within it, how far "
        "it reads ahead follows the measured latency and bandwidth (default 64)",
    )
    add(
        "--traceback",
        action="store_true",
        dest=prefix + "traceback",
        help="on an error, print the full Python traceback (for bug reports)",
    )


@dataclass(frozen=True)
class GlobalOptions:
    """The switches of one command line, before and after the command merged."""

    level: int = logging.WARNING
    quiet: bool = False  # no progress, no summary, no notes
    progress: str = "auto"  # "auto" (a bar on a terminal), "always" or "never"
    max_attempts: int | None = None
    timeout: float | None = None
    read_ahead_mb: float | None = None


def options(args: argparse.Namespace) -> GlobalOptions:
    """The merged switches of `args` (a namespace from any parser: missing fields are defaults)."""

    def both(name: str):
        return getattr(args, name, None), getattr(args, TOP + name, None)

    def count(name: str) -> int:
        return sum(int(v or 0) for v in both(name))

    def last(name: str):
        inner, outer = both(name)
        return inner if inner is not None else outer

    verbose, quiet = count("verbose"), count("quiet")
    if verbose and quiet:
        raise UsageError("-v and -q contradict each other: give one of them")
    log_level = last("log_level")
    if log_level is not None:
        level = LEVELS[log_level]
    elif quiet >= 2:
        level = logging.ERROR
    else:
        level = max(logging.WARNING - 10 * verbose, logging.DEBUG)
    progress = last("progress")
    mode = "always" if progress else "never" if progress is False or quiet else "auto"
    return GlobalOptions(
        level, quiet > 0, mode, last("max_attempts"), last("timeout"), last("read_ahead_mb")
    )


class _Formatter(logging.Formatter):
    """``warning: <message>``, as the commands' own notes read; with ``detailed`` (debug) also
    the seconds since start and the logger's name."""

    def __init__(self, detailed: bool):
        super().__init__()
        self.detailed = detailed

    def format(self, record: logging.LogRecord) -> str:
        label = LABELS.get(record.levelno, "error")
        text = record.getMessage()
        if record.exc_info and self.detailed:
            text += "\n" + self.formatException(record.exc_info)
        if self.detailed:
            return f"{label}: {record.relativeCreated / 1000:8.3f} s {record.name}: {text}"
        return f"{label}: {text}"


class _StderrHandler(logging.Handler):
    """Writes to whatever ``sys.stderr`` is at the time, above a progress bar when one runs."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            tqdm = sys.modules.get("tqdm")
            if tqdm is not None and getattr(tqdm.tqdm, "_instances", None):
                tqdm.tqdm.write(text, file=sys.stderr)
            else:
                sys.stderr.write(text + "\n")
                sys.stderr.flush()
        except Exception:
            self.handleError(record)


@contextlib.contextmanager
def logging_to_stderr(opts: GlobalOptions) -> Iterator[None]:
    """For one command line run: the ``shardtok`` loggers' records at `opts.level` and above
    on stderr, and shardtok's own Python warnings as one line each; all undone afterwards (a
    test may call ``main`` many times in one process)."""
    logger = logging.getLogger("shardtok")
    handler = _StderrHandler()
    handler.setFormatter(_Formatter(detailed=opts.level <= logging.DEBUG))
    saved_level = logger.level
    logger.setLevel(opts.level)
    logger.addHandler(handler)
    show = warnings.showwarning

    def one_line(message, category, filename, lineno, file=None, line=None):
        if str(filename).startswith(_PACKAGE):
            logger.warning("%s", message)
        else:
            show(message, category, filename, lineno, file, line)

    warnings.showwarning = one_line
    try:
        yield
    finally:
        warnings.showwarning = show
        logger.removeHandler(handler)
        logger.setLevel(saved_level)
