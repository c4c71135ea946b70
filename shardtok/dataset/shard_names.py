"""Shard lists and patterns: what a user names a subset of one dataset with, as WebDataset users do.

A dataset is a folder or URL prefix holding ``index.json`` and its shards; besides the folder a
user may name some of its shards:

* a brace pattern, WebDataset's syntax (its ``braceexpand``): ``shard-{000000..000099}.tar``
  (a numeric range, zero-padded to the wider bound when one starts with ``0``), ``{a,b}``
  (alternatives, nested as deep as needed), ``{a..e}`` (letters), an optional step
  ``{0..10..2}``, ``\\`` escaping a brace or comma; several patterns joined by ``::``;
* a glob, for local paths only (``data/shard-*.tar``): object stores and HTTP servers are
  never listed, so a remote subset is written with braces;
* a list of shard files or URLs (each may itself be a pattern).

``select_shards`` turns any of these into a dataset root (the folder holding ``index.json``)
and the shard file names, refusing anything that is not a subset of ONE dataset: entries in
two folders or origins, a name that is not a plain shard file name, a name given twice, a
pattern that matches nothing or would expand to more than ``MAX_NAMES`` names. Which of
those names the dataset's ``index.json`` lists is checked where the manifest is read
(``DatasetSource``).
"""

from __future__ import annotations

import glob
import itertools
import math
import os
import re
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from shardtok.errors import UsageError
from shardtok.format.compact_manifest import COMPACT_NAME
from shardtok.format.manifest import MANIFEST_NAME
from shardtok.storage.location import Location, display_url, name_problem

MAX_NAMES = 1_000_000  # names one pattern may expand to: refused beyond, before expanding
MAX_PATTERN = 65_536  # characters: nesting is parsed recursively, each level once more
# Digits of a range's bound or step: far more than any shard number needs, and below what
# Python turns into an int from text (4,300 digits) or prints a count of.
MAX_DIGITS = 30
SHARD_SUFFIX = ".tar"
MIX_HINT = "to mix datasets pass a mapping {location: weight} or --source"

# braceexpand's own expressions, so that every pattern means what it means in WebDataset.
_INT_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)(?:\.\.-?(\d+))?$")
_CHAR_RANGE = re.compile(r"^([A-Za-z])\.\.([A-Za-z])(?:\.\.-?(\d+))?$")
_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_ESCAPE = re.compile(r"\\(.)")
# "::" joins patterns (WebDataset's expand_urls), except inside an IPv6 host's brackets.
_PATTERN_JOIN = re.compile(r"::(?![^\[/]*\])")


# -- brace expansion --------------------------------------------------------------------------
# A pattern parses into a tree first, so its size is known (and refused when too large) before a
# single name is made. The parser is braceexpand's, step for step: its results, including its
# corner cases (unmatched "}" before "{", escapes stripped once per nesting level), are ours.


class _Literal:
    def __init__(self, text: str):
        self.text = text

    def count(self) -> int:
        return 1

    def values(self) -> list[str]:
        return [self.text]


class _IntRange:
    def __init__(self, start: str, end: str, step: str | None):
        for number in (start, end, step or ""):
            if len(number.lstrip("-")) > MAX_DIGITS:
                raise _TooManyDigits(number)
        padded = any(s.startswith(("0", "-0")) for s in (start, end) if s not in ("0", "-0"))
        self.format = f"%0{max(len(start), len(end)) if padded else 0}d"
        by = (int(step) or 1) if step else 1
        first, last = int(start), int(end)
        self.range = range(first, last + 1, by) if first < last else range(first, last - 1, -by)

    def count(self) -> int:
        # len() of a range stops at sys.maxsize; a bound of 20 digits passes it.
        r = self.range
        return max(0, (r.stop - r.start + r.step - (1 if r.step > 0 else -1)) // r.step)

    def values(self) -> list[str]:
        return [self.format % i for i in self.range]


class _CharRange:
    def __init__(self, start: str, end: str, step: str | None):
        if step and len(step) > MAX_DIGITS:
            raise _TooManyDigits(step)
        by = (int(step) or 1) if step else 1
        first, last = _ALPHABET.index(start), _ALPHABET.index(end)
        if first < last:
            self.chars = _ALPHABET[first : last + 1 : by]
        else:
            last = last or -len(_ALPHABET)
            self.chars = _ALPHABET[first : last - 1 : -by]

    def count(self) -> int:
        return len(self.chars)

    def values(self) -> list[str]:
        return list(self.chars)


class _Choice:
    """Alternatives, each a pattern (one alternative: the inside of braces that are kept)."""

    def __init__(self, patterns: list[list]):
        self.patterns = patterns

    def count(self) -> int:
        return sum(_count(p) for p in self.patterns)

    def values(self) -> list[str]:
        return [_unescape(v) for p in self.patterns for v in _raw(p)]


def _count(pattern: list) -> int:
    return math.prod(item.count() for item in pattern)


def _raw(pattern: list) -> list[str]:
    return ["".join(parts) for parts in itertools.product(*(i.values() for i in pattern))]


def _unescape(text: str) -> str:
    return _ESCAPE.sub(r"\1", text)


class _Unbalanced(Exception):
    pass


class _TooManyDigits(Exception):
    pass


def _parse_pattern(pattern: str) -> list:
    start = pos = depth = 0
    items: list = []
    while pos < len(pattern):
        char = pattern[pos]
        if char == "\\":
            pos += 2
            continue
        if char == "{":
            if depth == 0 and pos > start:
                items.append(_Literal(pattern[start:pos]))
                start = pos
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                expression = pattern[start + 1 : pos]
                item = _parse_expression(expression)
                if item is None:  # braces around neither a range nor alternatives stay
                    inner = _Choice([_parse_pattern(expression)])
                    items += [_Literal("{"), inner, _Literal("}")]
                else:
                    items.append(item)
                start = pos + 1
        pos += 1
    if depth != 0:
        raise _Unbalanced
    if start < pos:
        items.append(_Literal(pattern[start:]))
    return items


def _parse_expression(expression: str):
    match = _INT_RANGE.match(expression)
    if match:
        return _IntRange(*match.groups())
    match = _CHAR_RANGE.match(expression)
    if match:
        return _CharRange(*match.groups())
    return _parse_sequence(expression)


def _parse_sequence(sequence: str) -> _Choice | None:
    start = pos = depth = 0
    items: list[list] = []
    while pos < len(sequence):
        char = sequence[pos]
        if char == "\\":
            pos += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
        elif char == "," and depth == 0:
            items.append(_parse_pattern(sequence[start:pos]))
            start = pos + 1
        pos += 1
    if depth != 0 or not items:
        return None
    items.append(_parse_pattern(sequence[start:]))
    return _Choice(items)


def _parsed(pattern: str) -> list:
    shown = _shown(pattern)
    if len(pattern) > MAX_PATTERN:
        raise UsageError(f"pattern {shown} is longer than {MAX_PATTERN:,} characters")
    try:
        return _parse_pattern(pattern)
    except _Unbalanced:
        raise UsageError(f"pattern {shown}: unbalanced braces") from None
    except RecursionError:
        raise UsageError(f"pattern {shown}: braces nested too deep") from None
    except _TooManyDigits as exc:
        raise UsageError(
            f"pattern {shown}: a range's number has more than {MAX_DIGITS} digits "
            f"({_shown(exc.args[0])})"
        ) from None


def _expand(patterns: list[str], shown: str, limit: int) -> list[str]:
    trees = [_parsed(p) for p in patterns]
    count = sum(_count(t) for t in trees)
    if count > limit:
        # Many ranges multiply to a count Python would refuse to print (over 4,300 digits).
        many = f"{count:,}" if count < 10**MAX_DIGITS else f"over 10^{MAX_DIGITS}"
        raise UsageError(
            f"pattern {_shown(shown)} expands to {many} names, more than {limit:,}: name "
            "fewer shards per pattern"
        )
    return [_unescape(v) for tree in trees for v in _raw(tree)]


def expand_braces(pattern: str, *, limit: int = MAX_NAMES) -> list[str]:
    """The names brace pattern `pattern` stands for, in order: exactly ``braceexpand``'s list
    (module docstring). More than `limit` names is refused (``UsageError``) before any is made."""
    return _expand([pattern], pattern, limit)


def expand_urls(text: str, *, limit: int = MAX_NAMES) -> list[str]:
    """WebDataset's ``expand_urls`` for a string: patterns joined by ``::``, each brace-expanded
    (``::`` inside an IPv6 host's brackets joins nothing). WebDataset also substitutes
    ``${VAR}`` from ``WDS_VAR`` environment variables; shardtok reads no environment, so
    ``${...}`` stays as written."""
    return _expand(_PATTERN_JOIN.split(text), text, limit)


# -- a subset of one dataset ------------------------------------------------------------------


@dataclass(frozen=True)
class ShardSelection:
    """A dataset root (folder or URL prefix, as given) and the shard file names it was asked
    for (None: the whole dataset), in the order given."""

    root: str
    shards: tuple[str, ...] | None = None


def _shown(text: object) -> str:
    shown = repr(display_url(text) if isinstance(text, str) else text)
    return shown if len(shown) <= 120 else shown[:117] + "..."


def _is_remote_glob(where: Location) -> bool:
    return not where.is_local and any(c in urllib.parse.urlsplit(where.url).path for c in "*[")


def _based(text: str, base: Path | None) -> Location:
    where = Location(text)
    if base is not None and where.is_local and not os.path.isabs(where.local_path):
        return Location(str(base / where.local_path))
    return where


def is_pattern(text: str, base: Path | None = None) -> bool:
    """Whether string `text` is a pattern (braces, ``::``, a glob) rather than one path or
    URL. A local file or folder that exists is itself, whatever its name (`base`: the folder a
    relative path is read from)."""
    where = _based(text, base)
    if where.is_local and os.path.exists(where.local_path):
        return False
    if len(_PATTERN_JOIN.split(text)) > 1:
        return True
    if ("{" in text or "}" in text) and expand_braces(text) != [text]:
        return True
    return glob.has_magic(where.local_path) if where.is_local else _is_remote_glob(where)


def names_shards(text: str, base: Path | None = None) -> bool:
    """Whether string `text` names shards (a pattern, a glob or a ``.tar`` file) rather than a
    dataset folder or URL prefix. A local folder that exists is a folder, whatever its name."""
    where = _based(text, base)
    if where.is_local and os.path.isdir(where.local_path):
        return False
    return is_pattern(text, base) or where.name.endswith(SHARD_SUFFIX)


def _expanded(text: str, base: Path | None) -> list[str]:
    """The entries one string stands for: patterns expanded, local globs matched (relative
    local paths read from `base` when given)."""
    if not is_pattern(text, base):
        return [str(_based(text, base))]
    out: list[str] = []
    for name in expand_urls(text):
        where = _based(name, base)
        name = str(where)
        if where.is_local and glob.has_magic(where.local_path):
            if os.path.exists(where.local_path):  # a file whose name has "*" or "[": itself
                out.append(name)
                continue
            matches = sorted(glob.glob(where.local_path))
            if not matches:
                raise UsageError(f"{_shown(name)} matches no file")
            out += matches
        elif _is_remote_glob(where):
            raise UsageError(
                f"{_shown(name)}: globs are for local paths only (an object store or web "
                "server is not listed); name remote shards with a brace pattern such as "
                "shard-{000000..000099}.tar"
            )
        else:
            out.append(name)
        if len(out) > MAX_NAMES:
            raise UsageError(f"{_shown(text)} names more than {MAX_NAMES:,} shards")
    return out


def _split(entry: str) -> tuple[str, tuple, str]:
    """(the folder or URL prefix holding `entry`, as given; a key comparing folders and
    origins; the shard file name)."""
    where = Location(entry)
    if where.is_local:
        path = where.local_path
        if os.path.isdir(path):
            raise UsageError(
                f"{_shown(entry)} is a folder, not a shard file: a list or pattern names shard "
                f"files of one dataset; {MIX_HINT}"
            )
        folder, name = os.path.split(path)
        folder = folder or "."
        return folder, ("file", os.path.normpath(os.path.abspath(folder))), name
    parts = urllib.parse.urlsplit(where.url)
    if parts.query or parts.fragment:
        raise UsageError(
            f"{_shown(entry)}: a shard URL with a query or fragment names one object only, "
            f"not a shard beside the dataset's {MANIFEST_NAME}"
        )
    folder, _, name = where.url.rpartition("/")
    return folder, ("url", folder), name


def check_shard_name(entry: str, name: str) -> None:
    """Refuse `name` (from `entry`, as given) unless it is a plain shard file name."""
    problem = name_problem(name)
    if problem is None and name == MANIFEST_NAME:
        problem = f"the dataset's {MANIFEST_NAME}"
    elif problem is None and not name.endswith(SHARD_SUFFIX):
        problem = f"shard files end in {SHARD_SUFFIX}"
    if problem is not None:
        raise UsageError(
            f"{_shown(entry)} is not a shard file name ({problem}): a list or pattern names "
            f"shard files of one dataset; {MIX_HINT}"
        )


def check_not_manifest(text: str) -> None:
    """Refuse a dataset's ``index.json`` or ``index.compact`` given for the dataset (read as a
    folder, it would be looked for at ``.../index.json/index.json``; a local index.compact
    would be read as a damaged shard): the dataset is its folder or URL prefix."""
    name = Location(text).name
    if name in (MANIFEST_NAME, COMPACT_NAME):
        folder = text.rsplit(name, 1)[0].rstrip("/") or "."
        raise UsageError(
            f"{_shown(text)} is the dataset's {name}: name the dataset by its folder "
            f"or URL prefix, {_shown(folder)}"
        )


def select_shards(
    what: str | os.PathLike | Sequence[str | os.PathLike], *, base: Path | None = None
) -> ShardSelection:
    """The dataset and shards `what` names: a folder or URL prefix (the whole dataset), or a
    pattern, glob, ``.tar`` file or list of them (a subset; module docstring). `base`: the
    folder relative local paths are read from (a config file's), else the working folder."""
    if isinstance(what, (str, os.PathLike)):
        text = os.fspath(what)
        if not isinstance(text, str):
            raise UsageError(f"dataset location {what!r} is not text")
        if not names_shards(text, base):
            where = _based(text, base)
            check_not_manifest(text)
            if where.is_local and os.path.isfile(where.local_path):
                raise UsageError(
                    f"{_shown(text)} is a file, not a dataset folder (with {MANIFEST_NAME}) or "
                    f"a {SHARD_SUFFIX} shard of one"
                )
            return ShardSelection(text if where.url == text else str(where))
        entries = _expanded(text, base)
    elif isinstance(what, Sequence) and not isinstance(what, (bytes, bytearray)):
        entries = []
        for item in what:
            if not isinstance(item, (str, os.PathLike)):
                raise UsageError(f"a shard list holds {item!r}, not a path or URL")
            entries += _expanded(os.fspath(item), base)
    else:
        raise UsageError(f"a dataset is a path, URL, pattern or list of shards, not {what!r}")
    if not entries:
        raise UsageError("an empty list of shards names no data")
    root, key, names, seen = "", (), [], {}
    for entry in entries:
        folder, where, name = _split(entry)
        check_shard_name(entry, name)
        if not names:
            root, key = folder, where
        elif where != key:
            raise UsageError(
                f"{_shown(entry)} is not in {_shown(root)}, where {_shown(entries[0])} is: a "
                f"shard list or pattern names shards of one dataset; {MIX_HINT}"
            )
        if name in seen:
            raise UsageError(f"shard {_shown(entry)} is named twice ({_shown(seen[name])})")
        seen[name] = entry
        names.append(name)
    return ShardSelection(root, tuple(names))


__all__ = [
    "MAX_NAMES",
    "ShardSelection",
    "check_not_manifest",
    "check_shard_name",
    "expand_braces",
    "expand_urls",
    "is_pattern",
    "names_shards",
    "select_shards",
]
