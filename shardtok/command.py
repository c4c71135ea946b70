"""The `shardtok` console script and ``python -m shardtok``: the command line, with a Ctrl-C
during its imports reported like any other interruption (one line, exit 130)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    # Importing the commands and their layers (numpy, tokenizers...) takes a few tenths of a
    # second after start: the window a prompt Ctrl-C lands in. This module imports nothing
    # else, so only the interpreter's own start-up and the light `shardtok` package stay
    # outside the handler.
    try:
        from shardtok.cli.main import main as command
    except KeyboardInterrupt:
        print("shardtok: interrupted", file=sys.stderr)
        return 130
    return command(argv)


__all__ = ["main"]
