"""The `shardtok` console script and ``python -m shardtok``: the command line, with a Ctrl-C
during its imports reported like any other interruption (one line, exit 130)."""

from __future__ import annotations

import signal
import sys


def main(argv: list[str] | None = None) -> int:
    # Importing the commands and their layers (numpy, tokenizers...) takes a few tenths of a
    # second after start: the window a prompt Ctrl-C lands in. This module imports nothing
    # else, so only the interpreter's own start-up and the light `shardtok` package stay
    # outside the handler. A C extension interrupted while it initialises may turn the
    # KeyboardInterrupt into an ImportError of its own (numpy: "PyCapsule_Import could not
    # import module datetime"), so what counts is whether the signal came, not what was raised.
    came: list[int] = []

    def interrupted(signum, frame):
        came.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, interrupted)
    try:
        from shardtok.cli.main import main as command
    except BaseException:
        if not came:
            raise
        print("shardtok: interrupted", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGINT, previous)
    return command(argv)


__all__ = ["main"]
