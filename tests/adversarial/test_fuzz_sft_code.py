"""Mutated jq patterns and chat templates: whatever is generated, a pattern compiles and runs
or is refused with a ShardtokError (a record's failure is an SFTBad), a template renders or
fails with the sandbox's or the budget's error, nothing hangs, and the environment never shows
up in what comes back."""

from __future__ import annotations

import jinja2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardtok.convert.sft.conversation import SFTBad
from shardtok.convert.sft.jinja_env import compile_template, render_tracked
from shardtok.convert.sft.jq_patterns import JqPatterns
from shardtok.errors import ShardtokError

SECRET = "fuzz-secret-7d1e0c"
RECORD = {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}

JQ_PIECES = [
    ".conversations", "[]", "[0]", " | ", 'select(.from == "human")', "$ENV", "env", "input",
    "inputs", "$__loc__", "debug", "stderr", "error(", ")", "tostring", "range(1e8)", "..",
    "limit(3; ", "def f: f; ", "f", "$ ENV", '"\\(', "env.X", "getpath([\"a\"])", "first(",
    "[.[]?]", "input_filename", "(", ".from", "tojson", " + ", "now", "#", "\n", "halt",
]  # fmt: skip
JINJA_PIECES = [
    "{{ ", " }}", "{% for i in range(100000) %}", "{% endfor %}", "'A' * 2000000000",
    "'%0999999999d' % 1", "messages[0].content", "x", "{% if messages %}", "{% endif %}",
    "|join(',')", "|center(999999999)", "'{:>999999999}'.format(1)", "(range(1000)|list)",
    " ~ ", "2 ** 99999999999", "m.role", "{% for m in messages %}", "{% set ns = namespace(s='a') %}",
    "{% set ns.s = ns.s ~ ns.s %}", "'ab'", "cycler", "self", "[1] * 99999999",
]  # fmt: skip

FUZZ = settings(
    max_examples=20, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True
)


@pytest.fixture(autouse=True)
def secret(monkeypatch):
    monkeypatch.setenv("SHARDTOK_FUZZ_SECRET", SECRET)  # what must never come back


@FUZZ
@given(st.lists(st.sampled_from(JQ_PIECES), min_size=1, max_size=6))
def test_jq_pattern_mutations(pieces):
    pattern = "".join(pieces)
    try:
        patterns = JqPatterns((pattern,), "fuzz.yaml")
    except ShardtokError as exc:
        assert SECRET not in str(exc)
        return
    try:
        found = patterns.excluded(RECORD)
    finally:
        patterns.close()
    shown = found.detail if isinstance(found, SFTBad) else repr(found)
    assert SECRET not in shown


@FUZZ
@given(st.lists(st.sampled_from(JINJA_PIECES), min_size=1, max_size=8))
def test_template_mutations(pieces):
    source = "".join(pieces)
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    try:
        text, _ = render_tracked(compile_template(source), messages)
    except (jinja2.exceptions.TemplateError, TypeError, ValueError, ArithmeticError) as exc:
        assert SECRET not in str(exc)
        return
    except (AttributeError, KeyError, IndexError, RecursionError):
        return  # the template's own mistakes: the renderer makes them a bad record
    assert SECRET not in text and len(text) <= 64 << 20
