"""Argument types shared by the commands: sizes, compression levels, bounded counts.

Each raises ``argparse.ArgumentTypeError``, which the parser turns into one line and exit
status 2.
"""

from __future__ import annotations

import argparse
import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'64MB' = 64 * 10**6, '64MiB' = 64 * 2**20, '1048576' bytes."""
    match = _SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(
            f"cannot read size {text!r} (examples: 64MB, 1GiB, 1048576)"
        )
    number, prefix, binary = match.groups()
    power = "kmgt".find(prefix.lower()) + 1 if prefix else 0
    base = 1024 if binary else 1000
    size = int(float(number) * base**power)
    if size <= 0:
        raise argparse.ArgumentTypeError(f"size {text!r} must be positive")
    return size


def parse_compression(text: str) -> int | None:
    if text.lower() in ("0", "none", "off"):
        return None
    try:
        level = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"compression level {text!r}: give 1-22, or 0/none"
        ) from None
    if not 1 <= level <= 22:
        raise argparse.ArgumentTypeError(f"compression level {level}: give 1-22, or 0/none")
    return level


def at_least(low: int):
    """An argparse type: an integer >= `low` (argparse turns the refusal into exit status 2)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    return parse
