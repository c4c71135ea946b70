"""The process jq patterns run in (started by :mod:`shardtok.convert.sft.jq_patterns`).

Run as a script (``python -I jq_child.py``), never imported as part of the package: it needs
only the standard library and jq, so it starts in a fraction of a second, and it is started with
an empty environment, so jq's ``$ENV`` and ``env`` are ``{}`` whatever a pattern does (jq reads
the environment when it compiles a program). It sets its own address-space limit, and before
each record a CPU-time limit: a pattern that loops or grows without end is killed by the kernel,
and the parent rejects the record.

Protocol, one JSON document a line. First line in: ``{"path": sys.path, "patterns": [...],
"memory": bytes, "cpu_seconds": n, "max_paths": n, "max_error": n}``; first line out:
``{"errors": [null or the compile error of each pattern]}``. Then one record's JSON text a line
in, and ``{"paths": [...], "rewrites": [[pattern, rewrite]...]}`` or ``{"bad": detail}`` out.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import sys

_ARRAY_INDEX = "Cannot index array with"
# A leading path of plain steps (.a, ."a b", .["a"], [0]) followed by a top-level pipe.
_LEADING_PATH = re.compile(
    r'\s*((?:\.[A-Za-z_][A-Za-z0-9_]*|\."(?:[^"\\]|\\.)*"|\.?\["(?:[^"\\]|\\.)*"\]|\[\d+\])+)'
    r"\s*\|(.*)",
    re.DOTALL,
)


def rewrite(pattern: str) -> str | None:
    """`pattern` with ``[]`` after its leading path (``.a | f`` -> ``.a[] | f``), or None."""
    match = _LEADING_PATH.fullmatch(pattern)
    if match is None:
        return None
    return f"{match.group(1)}[] | {match.group(2).strip()}"


def error_text(exc: BaseException, limit: int) -> str:
    """The first line of `exc`, cut to `limit` characters: ``error(.)`` can put a whole record
    (megabytes) in a message that goes to rejects.jsonl and the terminal."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


class _TooMany(Exception):
    pass


class Evaluator:
    """The patterns, compiled, and the rewrite retry (see jq_patterns.py)."""

    def __init__(self, patterns, max_paths: int, max_error: int):
        import jq

        self._jq = jq
        self.patterns = list(patterns)
        self.max_paths = max_paths
        self.max_error = max_error
        self.compiled, self.errors = [], []
        for pattern in self.patterns:
            try:
                self.compiled.append(jq.compile(f"path({pattern})"))
                self.errors.append(None)
            except ValueError as exc:
                self.compiled.append(None)
                self.errors.append(str(exc))
        self._rewrites: dict[int, object] = {}

    def _all(self, compiled, text: str) -> list:
        found = []
        for path in compiled.input_text(text):
            found.append(path)
            if len(found) > self.max_paths:
                raise _TooMany
        return found

    def evaluate(self, text: str) -> dict:
        paths, used = [], []
        for index, compiled in enumerate(self.compiled):
            try:
                found = self._all(compiled, text)
            except _TooMany:
                return self._too_many(index)
            except Exception as exc:  # jq raises ValueError
                found = self._retry(index, text, exc)
                if isinstance(found, dict):
                    return found
                used.append([self.patterns[index], self._rewrites[index][0]])
            paths.extend(found)
        return {"paths": paths, "rewrites": used}

    def _too_many(self, index: int) -> dict:
        over = f"selects more than {self.max_paths} paths"
        return {"bad": f"pattern {self.patterns[index]!r}: {over}", "budget": over}

    def _retry(self, index: int, text: str, first: Exception):
        pattern = self.patterns[index]
        failed = f"pattern {pattern!r}: {error_text(first, self.max_error)}"
        if not isinstance(first, ValueError) or _ARRAY_INDEX not in str(first):
            return {"bad": failed}
        if index not in self._rewrites:
            other = rewrite(pattern)
            self._rewrites[index] = None
            if other is not None:
                with contextlib.suppress(ValueError):
                    self._rewrites[index] = (other, self._jq.compile(f"path({other})"))
        if self._rewrites[index] is None:
            return {"bad": failed}
        other, compiled = self._rewrites[index]
        try:
            return self._all(compiled, text)
        except _TooMany:
            return self._too_many(index)
        except Exception as exc:
            return {"bad": f"{failed}; retried as {other!r}: {error_text(exc, self.max_error)}"}


def _limit_cpu(resource, seconds: int) -> None:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = math.ceil(usage.ru_utime + usage.ru_stime) + seconds
    resource.setrlimit(resource.RLIMIT_CPU, (soft, resource.RLIM_INFINITY))


def main() -> None:
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    hello = json.loads(stdin.readline())
    sys.path[:] = [p for p in hello["path"] if isinstance(p, str)]
    try:
        import resource
    except ImportError:  # not POSIX: only the parent's wall-clock budget holds
        resource = None
    if resource is not None:
        resource.setrlimit(resource.RLIMIT_AS, (hello["memory"], hello["memory"]))
        _limit_cpu(resource, hello["cpu_seconds"])
    evaluator = Evaluator(hello["patterns"], hello["max_paths"], hello["max_error"])
    stdout.write(json.dumps({"errors": evaluator.errors}).encode() + b"\n")
    stdout.flush()
    for line in stdin:
        if resource is not None:
            _limit_cpu(resource, hello["cpu_seconds"])
        try:
            answer = evaluator.evaluate(line.decode("utf-8"))
            out = json.dumps(answer).encode()
        except MemoryError:
            out = b'{"memory": true}'
        stdout.write(out + b"\n")
        stdout.flush()


if __name__ == "__main__":
    main()
