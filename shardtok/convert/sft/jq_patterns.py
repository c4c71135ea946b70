"""The jq format: ``loss_masking_jq_patterns`` decide which rendered pieces are excluded.

Each pattern is evaluated as ``path(<pattern>)``, which yields the exact locations it selects
(``["conversations", 0]``, ``["instruction"]``) rather than copies of the values: two equal
human turns are then never confused, and a selected piece is known by where it is.

The reference note's own pattern, ``.conversations | select(.from == "human")``, is not valid
for a list in real jq ("Cannot index array with string"); its intent is plainly
``.conversations[] | select(...)``. A pattern that fails that way is retried with ``[]`` after
its leading path, and a note says so once. Every record evaluates the pattern as written first
and the rewrite only on that failure, so a record's result never depends on which records a
worker happened to see before it (output stays identical for any worker count).

Patterns are untrusted code (a config file found with a dataset), and jq is a full language:
``$ENV`` and ``env`` read the environment (cloud credentials included), ``input``, ``debug``,
``stderr``, ``$__loc__``, ``now``... reach outside the record, and ``repeat(.)``, ``def f: f;
f`` or ``last(range(1e9))`` never end inside one C call that no Python-level timer can stop.
So a pattern that names a way out of the record is refused at start-up (:func:`check_pattern`),
and patterns run in one long-lived child process per worker (jq_child.py): started with an empty
environment, under an address-space limit and a CPU-time limit per record, and killed by the
parent after a wall-clock limit. A record that exceeds a budget is a bad record ``jq_error``
saying which; the child is started again for the next record. At start-up each pattern also runs
on an empty record, so a pattern that never ends whatever the record is refused there.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import subprocess
import sys
import time
import weakref

from shardtok.convert.inputs.records import MISSING_FIELD
from shardtok.convert.sft.config import SFTConfig
from shardtok.convert.sft.conversation import (
    INVALID_CONVERSATION,
    JQ_ERROR,
    Conversation,
    Message,
    SFTBad,
)
from shardtok.convert.sft.fields import check_text, train_flag
from shardtok.convert.sft.jq_child import error_text, rewrite
from shardtok.errors import UsageError

__all__ = ["JqFormat", "JqPatterns", "check_pattern", "rewrite"]

# Budgets of one record (all its patterns together). Far above what a pattern that selects
# message paths needs (microseconds, kilobytes), far below what stalls a conversion.
CPU_SECONDS = 3
WALL_SECONDS = 60  # the child's CPU limit acts first; this one if it is stuck
MEMORY_BYTES = 4 << 30
MAX_PATHS = 1_000_000
MAX_ERROR = 300  # characters of a jq error message kept in a reject's detail
_START_SECONDS = 60  # starting the child: an interpreter and jq, on a loaded machine

# Builtins and keywords that read or write outside the record: the environment, other inputs,
# the clock, the terminal, files (modules), where jq is installed; or stop the process.
_OUTSIDE = {
    "env": "reads the environment",
    "input": "reads other inputs",
    "inputs": "reads other inputs",
    "input_filename": "reads outside the record",
    "input_line_number": "reads outside the record",
    "debug": "writes to the terminal",
    "stderr": "writes to the terminal",
    "halt": "stops the process",
    "halt_error": "stops the process",
    "get_search_list": "reads outside the record",
    "get_prog_origin": "reads outside the record",
    "get_jq_origin": "reads outside the record",
    "modulemeta": "reads files",
    "import": "reads files",
    "include": "reads files",
    "now": "reads the clock (masks would differ from run to run)",
    "localtime": "reads the clock and time zone",
    "strflocaltime": "reads the time zone",
}
# jq's own variables: $ENV, $__loc__, and the $__prog_*/$JQ_* some versions define.
_OUTSIDE_VARIABLE = re.compile(r"ENV|__\w*|JQ_\w*")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*")


def _code_names(pattern: str):
    """(name, is_variable) of each identifier in `pattern`'s code (not in string text, comments
    or field names such as ``.input``); string interpolations ``\\(...)`` are code."""
    i, n = 0, len(pattern)
    parens: list[int] = []  # open parentheses inside each interpolation being read
    in_string = False
    while i < n:
        c = pattern[i]
        if in_string:
            if c == "\\" and i + 1 < n:
                if pattern[i + 1] == "(":
                    parens.append(1)
                    in_string = False
                i += 2
                continue
            if c == '"':
                in_string = False
            i += 1
            continue
        if c == '"':
            in_string = True
        elif c == "#":
            while i < n and pattern[i] != "\n":
                i += 1
        elif c == "(" and parens:
            parens[-1] += 1
        elif c == ")" and parens:
            parens[-1] -= 1
            if parens[-1] == 0:
                parens.pop()
                in_string = True
        elif c == "$":
            j = i + 1
            while j < n and pattern[j] in " \t\r\n":
                j += 1
            match = _IDENT.match(pattern, j)
            if match:
                yield match.group(), True
                i = match.end()
                continue
        elif c.isalpha() or c == "_":
            match = _IDENT.match(pattern, i)
            if i == 0 or pattern[i - 1] != ".":
                yield match.group(), False
            i = match.end()
            continue
        elif c.isdigit():
            while i < n and (pattern[i].isalnum() or pattern[i] == "."):
                i += 1
            continue
        i += 1


def check_pattern(pattern: str, where: str) -> None:
    """UsageError if `pattern` names a builtin or variable that reaches outside the record."""
    for name, variable in _code_names(pattern):
        if variable and _OUTSIDE_VARIABLE.fullmatch(name):
            why = "reads the environment" if name == "ENV" else "reads outside the record"
        elif not variable and name.split("::")[-1] in _OUTSIDE:
            why = _OUTSIDE[name.split("::")[-1]]
        else:
            continue
        shown = f"${name}" if variable else name
        raise UsageError(
            f"{where}: jq pattern {pattern!r} uses {shown}, which {why}: a pattern may only "
            "select paths of the record"
        )


def _error(exc: Exception) -> str:
    return error_text(exc, MAX_ERROR)


class _Child:
    """The jq process of one JqPatterns; None-safe to close, restarted by the caller."""

    def __init__(self, patterns: tuple[str, ...]):
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jq_child.py")
        # -I and env={}: no PYTHON* variable, no user site, no current directory; and jq's
        # $ENV is empty. sys.path travels in the first line instead, so jq is found as here.
        self.proc = subprocess.Popen(
            [sys.executable, "-I", script],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={},
            close_fds=True,
        )
        self._finalizer = weakref.finalize(self, _kill, self.proc)
        self._buffer = b""
        hello = {
            "path": sys.path, "patterns": list(patterns), "memory": MEMORY_BYTES,
            "cpu_seconds": CPU_SECONDS, "max_paths": MAX_PATHS, "max_error": MAX_ERROR,
        }  # fmt: skip
        answer = self.ask(json.dumps(hello), _START_SECONDS)
        if answer is None or "errors" not in answer:
            self.close()
            raise UsageError("jq patterns: the jq process did not start (is jq installed?)")
        self.errors = answer["errors"]

    def ask(self, line: str, seconds: float) -> dict | None:
        """The answer to `line`, or None if the child died or ran out of time (then killed)."""
        try:
            self.proc.stdin.write(line.encode("utf-8") + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self.close()
            return None
        deadline = time.monotonic() + seconds
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.close()
                return None
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                self.close()
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        self._finalizer()


def _kill(proc: subprocess.Popen) -> None:
    for stream in (proc.stdin, proc.stdout):
        with contextlib.suppress(OSError):
            stream.close()
    if proc.poll() is None:
        proc.kill()
    proc.wait()


class JqPatterns:
    """The compiled patterns; :meth:`excluded` gives the paths a record's patterns select.

    ``rewrites`` lists ``(pattern, rewrite)`` for each pattern that needed its rewrite so far
    (the caller prints the note once for the run). :meth:`close` stops the jq process (also done
    when the object is collected, and by the process's exit)."""

    def __init__(self, patterns: tuple[str, ...], where: str = "loss_masking_jq_patterns"):
        self.patterns = tuple(patterns)
        self.where = where
        for pattern in self.patterns:
            check_pattern(pattern, where)
        self.rewrites: list[tuple[str, str]] = []
        self._child: _Child | None = None
        if self.patterns:
            self._start()

    def __getstate__(self):
        return {**self.__dict__, "_child": None}

    def _start(self) -> _Child:
        self._child = _Child(self.patterns)
        for pattern, error in zip(self.patterns, self._child.errors):
            if error is not None:
                self.close()
                # Positions would count the path( ) wrapper: keep only what is wrong.
                first = error.splitlines()[0].removeprefix("jq: error: ")
                first = first.split(" at <top-level>")[0]
                raise UsageError(f"{self.where}: invalid jq pattern {pattern!r}: {first}")
        return self._child

    def close(self) -> None:
        if self._child is not None:
            self._child.close()
            self._child = None

    def probe(self) -> None:
        """Run every pattern on an empty record: UsageError for one that exceeds a budget
        there, as it would on every record (its ordinary jq errors are the records' matter)."""
        for pattern in self.patterns:
            alone = JqPatterns((pattern,), self.where)
            try:
                _, over = alone._ask("{}")
            finally:
                alone.close()
            if over is not None:
                raise UsageError(
                    f"{self.where}: jq pattern {pattern!r} {over} on an empty record {{}}: a "
                    "pattern must finish within the budget on any record"
                )

    def _ask(self, text: str) -> tuple[list[list] | SFTBad, str | None]:
        """(paths or the bad record, the budget it exceeded or None)."""
        child = self._child if self._child is not None and self._child.alive else self._start()
        answer = child.ask(text, WALL_SECONDS)
        if answer is None or "memory" in answer:
            self.close()  # killed, or its memory is in doubt: a fresh one for the next record
            what = f"{MEMORY_BYTES >> 30} GiB of memory"
            if answer is None:
                what = f"{CPU_SECONDS} s of CPU, {WALL_SECONDS} s in all or {what}"
            over = f"exceeds the budget of a record ({what})"
            if len(self.patterns) == 1:
                return SFTBad(JQ_ERROR, f"pattern {self.patterns[0]!r}: {over}"), over
            return SFTBad(JQ_ERROR, f"the jq patterns {over.replace('exceeds', 'exceed')}"), over
        if "bad" in answer:
            return SFTBad(JQ_ERROR, answer["bad"]), answer.get("budget")
        for pattern, other in answer["rewrites"]:
            if (pattern, other) not in self.rewrites:
                self.rewrites.append((pattern, other))
        return answer["paths"], None

    def excluded(self, record) -> list[list] | SFTBad:
        if not self.patterns:
            return []
        try:
            text = json.dumps(record)
        except Exception as exc:  # odd Parquet values: what jq's own json.dumps raised
            return SFTBad(JQ_ERROR, f"pattern {self.patterns[0]!r}: {_error(exc)}")
        return self._ask(text)[0]


def _covers(selected: list, piece: tuple) -> bool:
    """Whether a selected path covers the piece at `piece`: one is a prefix of the other (a
    selected message field excludes its message); a slice step covers the indices in it."""
    for step, at in zip(selected, piece):
        if isinstance(step, dict) and isinstance(at, int):
            start, end = step.get("start"), step.get("end")
            if (start is not None and at < start) or (end is not None and at >= end):
                return False
        elif step != at:
            return False
    return True


class JqFormat:
    """A record to the pieces ``message_construction`` names, in order: a string field is one
    piece, a list of message objects (``value`` or ``content``) one piece per message. A
    piece's role is its key, or the message's ``from``/``role``; ``train`` is False for the
    pieces a pattern selects (unless ``train_on_input``), or the message's own ``train``."""

    def __init__(self, config: SFTConfig):
        self.keys = config.message_construction
        self.train_all = config.train_on_input
        self.patterns = JqPatterns(config.loss_masking_jq_patterns, config.source)

    @property
    def rewrites(self) -> list[tuple[str, str]]:
        return self.patterns.rewrites

    def __call__(self, record) -> Conversation | SFTBad:
        if not isinstance(record, dict):
            return SFTBad(
                INVALID_CONVERSATION, f"the record is a {type(record).__name__}, not an object"
            )
        selected = self.patterns.excluded(record)
        if isinstance(selected, SFTBad):
            return selected

        def train(at: tuple, own=None) -> bool:
            if own is not None:
                return own
            return self.train_all or not any(_covers(s, at) for s in selected)

        messages = []
        for key in self.keys:
            value = record.get(key)
            if value is None:
                continue  # the note's extra keys (instruction, role) are optional
            if isinstance(value, str):
                text = check_text(value, f"field {key!r}")
                if isinstance(text, SFTBad):
                    return text
                messages.append(Message(key, text, train((key,))))
                continue
            if not isinstance(value, list):
                return SFTBad(
                    INVALID_CONVERSATION,
                    f"field {key!r} is a {type(value).__name__}: message_construction renders "
                    "strings and lists of messages",
                )
            for i, item in enumerate(value):
                piece = _message(key, i, item)
                if isinstance(piece, SFTBad):
                    return piece
                role, content, own = piece
                messages.append(Message(role, content, train((key, i), own)))
        if not messages:
            return SFTBad(MISSING_FIELD, f"none of the fields {', '.join(self.keys)} is present")
        return Conversation(tuple(messages))


def _message(key: str, i: int, item) -> tuple[str, str, bool | None] | SFTBad:
    what = f"{key}[{i}]"
    if not isinstance(item, dict):
        return SFTBad(INVALID_CONVERSATION, f"{what} is a {type(item).__name__}, not an object")
    field = "value" if "value" in item else "content"
    if field not in item:
        return SFTBad(INVALID_CONVERSATION, f"{what} has neither 'value' nor 'content'")
    content = check_text(item[field], f"{what}: {field!r}")
    if isinstance(content, SFTBad):
        return content
    role = item.get("from", item.get("role", key))
    if not isinstance(role, str):
        return SFTBad(INVALID_CONVERSATION, f"{what}: role {role!r} is not a string")
    own = train_flag(item.get("train"), what)
    if isinstance(own, SFTBad):
        return own
    return role, content, own
