"""jq patterns and chat templates are untrusted code: issue 36's probes. Each ran before the
fix: the environment written to rejects.jsonl, or a convert that never returned (the subprocess
timeout is only a guard; the refusal comes from counted budgets or the child's CPU limit)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shardtok.convert.sft.jq_patterns import JqPatterns, check_pattern
from shardtok.errors import UsageError
from tests.helpers.sft_data import special_tokenizer

SECRET = "AKIAFAKESECRET0123456789probe"
RECORD = '{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}\n'


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Path:
    return special_tokenizer(tmp_path_factory.mktemp("tok") / "special")


def convert(tmp_path, tok, config: str, *extra, records=RECORD):
    (tmp_path / "c.jsonl").write_text(records)
    (tmp_path / "sft.yaml").write_text(config)
    env = {"PATH": "/usr/bin:/bin", "AWS_SECRET_ACCESS_KEY": SECRET}
    cmd = [sys.executable, "-m", "shardtok", "convert", "c.jsonl", "-o", "out", "--tokenizer"]
    cmd += [str(tok), "--sft", "sft.yaml", "--on-bad-record", "skip", "-q", *extra]
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = str(root)
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def jq_config(pattern: str) -> str:
    return f"loss_masking_jq_patterns:\n  - {json.dumps(pattern)}\nmessage_construction: [conversations]\n"


def test_env_pattern_is_refused_and_nothing_leaks(tmp_path, tok):
    done = convert(tmp_path, tok, jq_config("error($ENV | tostring)"))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "shardtok convert: error: sft.yaml: jq pattern 'error($ENV | tostring)' uses $ENV, "
        "which reads the environment: a pattern may only select paths of the record"
    ]
    written = "".join(p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file())
    assert SECRET not in written + done.stdout + done.stderr


def test_a_pattern_that_never_ends_is_refused_at_start_up(tmp_path, tok):
    pattern = "def f: f; f"
    done = convert(tmp_path, tok, jq_config(pattern))
    assert done.returncode == 2, done.stderr
    assert (
        done.stderr.startswith(f"shardtok convert: error: sft.yaml: jq pattern {pattern!r} ")
        and "on an empty record {}: a pattern must finish within the budget" in done.stderr
    )


@pytest.mark.parametrize("pattern", ["repeat(.)", ".conversations[range(1e8)]"])
def test_other_endless_patterns_are_refused_by_the_probe(monkeypatch, pattern):
    # The probe that refused the one above through the command, in process: with a budget of
    # one CPU-second instead of three, so that each case costs one.
    from shardtok.convert.sft import jq_patterns

    monkeypatch.setattr(jq_patterns, "CPU_SECONDS", 1)
    patterns = JqPatterns((pattern,), "cfg.yaml")
    try:
        with pytest.raises(UsageError, match=r"on an empty record \{\}: a pattern must finish"):
            patterns.probe()
    finally:
        patterns.close()


def test_a_pattern_that_never_ends_on_one_record_rejects_it(tmp_path, tok):
    pattern = 'if .loop then last(range(1e15)) else .conversations[] | select(.from == "human") end'
    records = RECORD + '{"loop": true, ' + RECORD[1:] + RECORD
    done = convert(tmp_path, tok, jq_config(pattern), records=records)
    assert done.returncode == 0, done.stderr
    rejects = [json.loads(x) for x in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert [(r["line"], r["reason"]) for r in rejects] == [(2, "jq_error")]
    assert "exceeds the budget of a record" in rejects[0]["detail"]


BOMBS = {
    "nested_range": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
    "{% endfor %}",
    "repeat": "{{ 'A' * 2000000000 }}",
}
GOOD = (  # the bundled chatml template's body: passes the start-up turn checks
    "{%- for message in messages -%}{%- if message.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- generation -%}{{- message.content + '<|im_end|>' -}}{%- endgeneration -%}"
    "{{- '\\n' -}}{%- else -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


@pytest.mark.parametrize("bomb", sorted(BOMBS))
def test_a_template_bomb_is_refused_at_start_up(tmp_path, tok, bomb):
    (tmp_path / "t.jinja").write_text(GOOD + "\n" + BOMBS[bomb])
    done = convert(tmp_path, tok, "format: sharegpt\n", "--chat-template", "t.jinja")
    assert done.returncode == 2, done.stderr
    line = GOOD.count("\n") + 2
    assert done.stderr.startswith(
        f"shardtok convert: error: chat template 't.jinja', line {line}: "
    )
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_template_bomb_on_one_record_rejects_it(tmp_path, tok):
    bomb = "{% if messages|length > 5 %}{{ 'A' * 2000000000 }}{% endif %}"
    (tmp_path / "t.jinja").write_text(GOOD + bomb)
    turns = [{"from": "human" if i % 2 == 0 else "gpt", "value": f"m{i}"} for i in range(6)]
    records = RECORD + json.dumps({"conversations": turns}) + "\n"
    done = convert(
        tmp_path, tok, "format: sharegpt\n", "--chat-template", "t.jinja", records=records
    )
    assert done.returncode == 0, done.stderr
    rejects = [json.loads(x) for x in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert [(r["line"], r["reason"]) for r in rejects] == [(2, "invalid_conversation")]
    assert f"line {GOOD.count(chr(10)) + 1}: '*' would make more than" in rejects[0]["detail"]


@pytest.mark.parametrize(
    "pattern",
    ["env.HOME", "$ENV", "$ ENV", "input", "[inputs]", "$__loc__", "input_filename", "debug",
     ".a | stderr", '"\\(env)"', "now", 'import "x" as x; .', "halt_error"],
)  # fmt: skip
def test_ways_out_of_the_record_are_refused(pattern):
    with pytest.raises(UsageError, match=r"^cfg\.yaml: jq pattern .* uses .*, which "):
        JqPatterns((pattern,), "cfg.yaml")


@pytest.mark.parametrize(
    "pattern",
    [".input", '.conversations[] | select(.from == "env")', '."$ENV"', ".a # env\n| .b",
     '.x | select(. == "\\(.y) input")', ".environment", ".inputs[0]"],
)  # fmt: skip
def test_names_in_strings_comments_and_fields_are_not_refused(pattern):
    check_pattern(pattern, "cfg.yaml")


def test_a_jq_error_message_is_cut():
    patterns = JqPatterns(("error(.x * 1000)",))
    try:
        bad = patterns.excluded({"x": "y" * 1000})
    finally:
        patterns.close()
    assert bad.reason == "jq_error" and len(bad.detail) < 400
