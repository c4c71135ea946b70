"""The switches every command takes (-v, -q, --log-level, --progress, --max-attempts,
--timeout), before or after its name, and what the logging they set up prints."""

from __future__ import annotations

import json
import logging

import pytest

from shardtok.cli import logs
from shardtok.cli.main import build_parser, main
from shardtok.cli.storage_args import client_options, retry_policy
from shardtok.convert.job.workdir import WORK_DIR_NAME
from shardtok.errors import UsageError
from shardtok.storage import RetryPolicy

# Every command and phase, with the arguments it needs to parse.
COMMANDS = [
    ["convert", "in.jsonl", "-o", "out"],
    ["convert", "plan", "in.jsonl", "-o", "out"],
    ["convert", "run-units", "-o", "out", "--rank", "0", "--world-size", "1"],
    ["convert", "status", "-o", "out"],
    ["convert", "merge", "-o", "out"],
    ["sample-corpus", "c.jsonl"],
    ["stream", "ds", "--seq-len", "8", "--batch-size", "1"],
    ["trace", "ds", "--seq-len", "8", "--batch-size", "1", "--step", "1"],
    ["inspect", "ds"],
    ["verify", "ds"],
    ["import-megatron", "prefix", "out"],
    ["export-megatron", "ds", "prefix"],
]


def switches(*argv: str) -> logs.GlobalOptions:
    return logs.options(build_parser().parse_args(list(argv)))


@pytest.mark.parametrize("words", COMMANDS, ids=lambda w: "-".join(w[:2]))
def test_every_command_takes_the_switches_before_or_after_its_name(words):
    after = switches(*words, "-vv", "--max-attempts", "3", "--timeout", "2.5", "--no-progress")
    before = switches("-vv", "--max-attempts", "3", "--timeout", "2.5", "--no-progress", *words)
    for got in (after, before):
        assert got.level == logging.DEBUG and got.progress == "never" and not got.quiet
        assert (got.max_attempts, got.timeout) == (3, 2.5)
    args = build_parser().parse_args([*words, "--max-attempts", "3", "--timeout", "2.5"])
    assert retry_policy(args) == RetryPolicy(max_attempts=3, timeout=2.5)
    assert retry_policy(build_parser().parse_args(words)) is None  # the library's defaults


def test_levels_and_progress():
    assert switches("inspect", "ds") == logs.GlobalOptions(logging.WARNING, False, "auto")
    assert switches("-v", "inspect", "ds", "-v").level == logging.DEBUG  # counted across
    assert switches("inspect", "ds", "-v").level == logging.INFO
    quiet = switches("inspect", "ds", "-q")
    assert (quiet.level, quiet.quiet, quiet.progress) == (logging.WARNING, True, "never")
    assert switches("-qq", "inspect", "ds").level == logging.ERROR
    # --log-level wins over counting, and the one after the command over the one before.
    assert switches("--log-level", "ERROR", "inspect", "ds", "-v").level == logging.ERROR
    assert switches("--log-level", "error", "inspect", "ds", "--log-level", "info").level == (
        logging.INFO
    )
    assert switches("inspect", "ds", "--progress").progress == "always"
    assert switches("--progress", "inspect", "ds", "--no-progress").progress == "never"
    assert switches("-q", "inspect", "ds", "--progress").progress == "always"  # asked for
    with pytest.raises(UsageError, match="-v and -q"):
        switches("-v", "inspect", "ds", "-q")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["inspect", "ds", "--timeout", "0"], "--timeout: must be more than 0 seconds"),
        (["--max-attempts", "0", "inspect", "ds"], "--max-attempts: must be at least 1"),
        (["inspect", "ds", "--log-level", "loud"], "--log-level: invalid choice: 'loud'"),
        (["-v", "inspect", "ds", "-q"], "-v and -q contradict each other"),
    ],
)
def test_bad_switches_are_one_line_usage_errors(argv, message, capsys):
    try:
        status = main(argv)
    except SystemExit as stop:  # argparse's own refusals
        status = stop.code
    assert status == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_convert_store_options_follow_the_switches():
    def options(*argv: str):
        args = build_parser().parse_args(["convert", "in.jsonl", "-o", "out", *argv])
        return client_options(args, [*args.inputs, args.output])

    assert options("--max-attempts", "4") is None  # nothing remote: nothing to configure
    args = build_parser().parse_args(["convert", "s3://b/in/", "-o", "s3://b/out/"])
    assert client_options(args, ["s3://b/in/", "s3://b/out/"]) is None  # no switch given
    args = build_parser().parse_args(
        ["convert", "s3://b/in/", "-o", "out", "--max-attempts", "4", "--timeout", "7"]
    )
    config = client_options(args, [*args.inputs, args.output])["config_kwargs"]
    assert config["retries"]["total_max_attempts"] == 4 and config["read_timeout"] == 7
    with pytest.raises(UsageError, match="use http and s3"):
        client_options(args, ["s3://b/in/", "https://h/x.jsonl"])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("logging") / "corpus.jsonl"
    text = "".join(json.dumps({"text": f"document {i} " * 20}) + "\n" for i in range(300))
    path.write_text(text)
    return path


def convert(corpus, out, *switches: str) -> list[str]:
    return ["convert", str(corpus), "-o", str(out), "--workers", "1", *switches]


def test_default_quiet_and_verbose_runs(corpus, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(convert(corpus, out, "--unit-size", "16KiB", "--keep-work")) == 0
    first = capsys.readouterr()
    assert "converted in" in first.out
    assert not [line for line in first.err.splitlines() if line.startswith(("info:", "debug:"))]
    assert "converting:" not in first.err  # no bar: stderr is not a terminal
    # Work of other options is discarded with a warning, which -q keeps and -qq does not.
    for extra, expected in ((["-q"], 1), (["-qq"], 0)):
        (out / "index.json").unlink()
        (out / WORK_DIR_NAME).mkdir(exist_ok=True)
        (out / WORK_DIR_NAME / "plan.json").write_text(json.dumps({"format": 1}))
        assert main(convert(corpus, out, "--unit-size", "16KiB", *extra)) == 0
        quiet = capsys.readouterr()
        assert quiet.out == "" and quiet.err.count("\n") == expected, quiet.err
        assert quiet.err == "" or (
            quiet.err.startswith("warning: ") and "starting over" in quiet.err
        )
    # -v: what each phase did; -vv: every detail, with the logger's name.
    other = tmp_path / "other"
    assert main(convert(corpus, other, "-v", "--progress")) == 0
    verbose = capsys.readouterr()
    assert "info: tokenized 300 documents" in verbose.err
    assert "converting: 100% (" in verbose.err  # --progress off a terminal: plain lines
    assert main(["-vv", "stream", str(other), "--seq-len", "16", "--batch-size", "2"]) == 0
    debug = [line for line in capsys.readouterr().err.splitlines() if line.startswith("debug:")]
    assert any("shardtok.stream.slice_stream: " in line for line in debug), debug


def test_phases_report_the_same_way(corpus, tmp_path, capsys):
    out = str(tmp_path / "phased")
    assert main(["convert", "plan", str(corpus), "-o", out, "-v"]) == 0
    planned = capsys.readouterr()
    # the note is in the summary
    assert "the unit size was chosen for this corpus (--unit-size sets it" in planned.out
    assert "info: planned " in planned.err
    common = ["-o", out, "--workers", "1", "--progress"]
    assert main(["convert", "run-units", *common, "--rank", "0", "--world-size", "1"]) == 0
    assert "converting: 100% (" in capsys.readouterr().err
    assert main(["convert", "merge", "-o", out, "--progress", "-v"]) == 0
    merged = capsys.readouterr()
    assert "merging: 100% (1 of 1 shard)" in merged.err and "info: wrote " in merged.err
    assert main(["convert", "merge", "-o", out, "-q"]) == 0  # already merged: nothing to say
    assert capsys.readouterr() == ("", "")


def test_logging_is_undone_after_a_run(corpus, tmp_path, caplog):
    logger = logging.getLogger("shardtok")
    handlers, level = list(logger.handlers), logger.level
    assert any(isinstance(h, logging.NullHandler) for h in handlers)
    assert main(convert(corpus, tmp_path / "o", "-vv")) == 0
    assert logger.handlers == handlers and logger.level == level
    # The library's records reached the root logger too (a Python user's handlers see them).
    assert any(r.name.startswith("shardtok.") for r in caplog.records)
