"""YAML that someone else wrote (mix configs, curricula, SFT configs), read with bounded work.

``yaml.safe_load`` builds only plain data, but bounds nothing else: an alias stands for its whole
anchored value, so a few lines of aliases of aliases ("billion laughs") make a value whose repr,
comparison or iteration never ends; nesting is bounded only by Python's recursion limit (a
RecursionError); an integer of thousands of digits is a ValueError. ``safe_load`` here is the
same loader (on libyaml's parser when PyYAML has it) with limits, each refused as a
``YAMLError`` that carries the line:

* aliases stay allowed: anchors and ``<<: *defaults`` merges are how people write settings that
  repeat across stages, and ``yaml.dump`` writes anchors for objects a config shares. What is
  bounded is what they stand for: the document with every alias written out holds at most
  ``MAX_EXPANDED`` nodes plus scalar characters (the work any later repr, comparison or walk
  can do), and an alias inside its own anchor (a value that contains itself) is refused;
* nesting, aliases written out included, is at most ``MAX_DEPTH`` levels (Nanotron's deepest,
  ``data_stages[i].data.dataset.dataset_path.<path>``, is 6);
* integers fit in 64 bits (seeds, steps and batch counts; a bigger one is a typo or an attack);
* the text is at most ``MAX_BYTES`` long.

``shown`` is what a message may echo of a value read from such a file.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from yaml import YAMLError  # noqa: F401  (the error callers catch, as with PyYAML itself)
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.error import MarkedYAMLError
from yaml.events import AliasEvent
from yaml.nodes import ScalarNode, SequenceNode
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import Resolver
from yaml.scanner import Scanner

MAX_BYTES = 8 << 20
MAX_EXPANDED = 16_000_000
MAX_DEPTH = 64
MAX_INT_BITS = 64
SHOWN = 200  # characters of a value a message echoes


class YamlLimitError(MarkedYAMLError):
    """A document past one of the limits (module docstring)."""

    def __init__(self, problem: str, mark=None):
        super().__init__(problem=problem, problem_mark=mark)


class _Composer(Composer):
    # Every composed node carries what it stands for with its aliases written out, measured
    # from its children when it is complete, so an alias costs one lookup, not a walk.
    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            node = self.anchors.get(event.anchor)
            if node is not None and not hasattr(node, "_shardtok_size"):
                raise YamlLimitError(
                    f"alias {shown(event.anchor)} is inside its own anchor (a value that "
                    "contains itself)",
                    event.start_mark,
                )
            return super().compose_node(parent, index)
        level = getattr(self, "_shardtok_level", 0)
        if level >= MAX_DEPTH:
            raise YamlLimitError(f"nested deeper than {MAX_DEPTH} levels", event.start_mark)
        self._shardtok_level = level + 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self._shardtok_level = level
        _measure(node)
        return node


def _measure(node) -> None:
    if isinstance(node, ScalarNode):
        size, depth = 1 + len(node.value), 1
    else:
        children = (
            node.value if isinstance(node, SequenceNode) else [n for p in node.value for n in p]
        )
        size = 1 + sum(c._shardtok_size for c in children)
        depth = 1 + max((c._shardtok_depth for c in children), default=0)
    if size > MAX_EXPANDED:
        raise YamlLimitError(
            f"with its aliases written out this value holds more than {MAX_EXPANDED:,} nodes "
            "and characters (aliases of aliases: a YAML bomb?)",
            node.start_mark,
        )
    if depth > MAX_DEPTH:
        raise YamlLimitError(
            f"with its aliases written out this value nests deeper than {MAX_DEPTH} levels",
            node.start_mark,
        )
    node._shardtok_size, node._shardtok_depth = size, depth


class _Constructor(SafeConstructor):
    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep)
        except (ValueError, KeyError, AttributeError, TypeError, OverflowError) as exc:
            # An explicit tag on a scalar that is not of it (``!!int x``, ``!!bool maybe``)
            # fails in PyYAML's constructors with a plain Python error: say where.
            raise YamlLimitError(
                f"{shown(node.tag, 60)} cannot be made of this value ({type(exc).__name__}: {exc})",
                node.start_mark,
            ) from None

    def construct_yaml_int(self, node):
        digits = self.construct_scalar(node).replace("_", "")
        # Checked before int() sees it: Python refuses over 4,300 decimal digits with a
        # ValueError, and YAML's base-60 integers cost quadratic time in their length.
        if len(digits) > 3 * MAX_INT_BITS:
            raise YamlLimitError(
                f"an integer of {len(digits):,} characters: integers here fit in "
                f"{MAX_INT_BITS} bits",
                node.start_mark,
            )
        value = super().construct_yaml_int(node)
        if value.bit_length() > MAX_INT_BITS:
            raise YamlLimitError(
                f"integer {value} does not fit in {MAX_INT_BITS} bits", node.start_mark
            )
        return value


_Constructor.add_constructor("tag:yaml.org,2002:int", _Constructor.construct_yaml_int)


class _PureLoader(Reader, Scanner, Parser, _Composer, _Constructor, Resolver):
    def __init__(self, stream):
        Reader.__init__(self, stream)
        Scanner.__init__(self)
        Parser.__init__(self)
        _Composer.__init__(self)
        _Constructor.__init__(self)
        Resolver.__init__(self)


try:
    from yaml import CParser  # libyaml: about ten times faster on a long list of shards
except ImportError:  # PyYAML built without libyaml
    _Loader: type = _PureLoader
else:

    class _Loader(_Composer, _Constructor, Resolver, CParser):  # type: ignore[no-redef]
        # CParser only for events: the composing (where the limits are) stays in Python.
        def __init__(self, stream):
            CParser.__init__(self, stream)
            _Composer.__init__(self)
            _Constructor.__init__(self)
            Resolver.__init__(self)


def safe_load(text: str | bytes, *, pure: bool = False):
    """The one document in `text`, as ``yaml.safe_load`` builds it, within the limits."""
    if len(text) > MAX_BYTES:
        raise YamlLimitError(f"{len(text):,} long: a config here is at most {MAX_BYTES:,}")
    loader = (_PureLoader if pure else _Loader)(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def read(path: str | Path):
    """The one document in file `path` (OSError when it cannot be read)."""
    with open(path, "rb") as file:
        # A pipe or /dev/zero has no size to check first: read one byte past the limit.
        raw = file.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        raise YamlLimitError(f"longer than {MAX_BYTES:,} bytes, which is a config's limit here")
    return safe_load(raw)


def explain(exc: YAMLError) -> tuple[int | None, str]:
    """(the 1-based line, a one-line problem of bounded length) of a YAML error."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    line = mark.line + 1 if mark is not None else None
    problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [""])[0]
    problem = " ".join(str(problem).split())
    if len(problem) > SHOWN:
        problem = f"{problem[:SHOWN]}... ({len(problem):,} characters)"
    return line, problem


class _Full(Exception):
    pass


def shown(value: object, limit: int = SHOWN) -> str:
    """``repr(value)`` when that is at most `limit` characters, else its first `limit` and how
    big the value is; never builds more than `limit` characters of it (an alias bomb's repr
    would not end)."""
    out: list[str] = []
    left = [limit + 1]

    def put(text: str) -> None:
        out.append(text[: left[0]])
        left[0] -= len(text)
        if left[0] <= 0:
            raise _Full

    def walk(v: object) -> None:
        # Every container puts at least one character, so the budget bounds the recursion.
        if isinstance(v, (str, bytes)):
            put(repr(v[: limit + 1]))
        elif isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 4 * limit:
            put(f"<an integer of {v.bit_length():,} bits>")
        elif isinstance(v, Mapping):
            put("{")
            for n, (key, item) in enumerate(v.items()):
                put(", " if n else "")
                walk(key)
                put(": ")
                walk(item)
            put("}")
        elif isinstance(v, (list, tuple, set, frozenset)):
            put("[" if isinstance(v, list) else "(" if isinstance(v, tuple) else "{")
            for n, item in enumerate(v):
                put(", " if n else "")
                walk(item)
            put("]" if isinstance(v, list) else ")" if isinstance(v, tuple) else "}")
        else:
            put(repr(v))

    try:
        walk(value)
    except _Full:
        return f"{''.join(out)[:limit]}... ({_size(value)})"
    return "".join(out)


def _size(value: object) -> str:
    if isinstance(value, (str, bytes)):
        return f"{len(value):,} characters"
    if isinstance(value, Mapping):
        return f"a mapping of {len(value):,} entries"
    if isinstance(value, (list, tuple, set, frozenset)):
        return f"a {type(value).__name__} of {len(value):,} items"
    return f"a {type(value).__name__}"


__all__ = ["MAX_BYTES", "MAX_DEPTH", "MAX_EXPANDED", "YAMLError", "explain", "read", "safe_load"]
