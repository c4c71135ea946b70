"""`shardtok convert plan | run-units | status | merge` as separate processes: the same bytes as
`shardtok convert ... --workers 1`, after a SIGKILL, with two copies of one rank at once, and the
same first failure (status and merge) as the one-command run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardtok.cli.main import build_parser
from shardtok.convert.job.workdir import WORK_DIR_NAME
from tests.convert.test_determinism import tree_digest, write_corpus

UNIT = ("--unit-size", "32KiB")
SHARD = ("--shard-size", "64KiB", "--frame-size", "16KiB")


def shardtok(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "shardtok", "convert", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def run(*args: str, expect: int = 0) -> tuple[str, str]:
    proc = shardtok(*args)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == expect, (args, stdout, stderr)
    return stdout, stderr


def insert_lines(path: Path, lines: dict[int, str]) -> None:
    """Put `lines` (1-based line number -> text) into the file at those line numbers."""
    rows = path.read_text().splitlines()
    for number in sorted(lines):
        rows.insert(number - 1, lines[number])
    path.write_text("\n".join(rows) + "\n")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Two files, the second with bad records (so --on-bad-record skip writes rejects.jsonl)."""
    folder = tmp_path_factory.mktemp("corpus")
    write_corpus(folder / "part-a.jsonl", 500, seed=1)
    write_corpus(folder / "part-b.jsonl", 300, seed=2)
    insert_lines(folder / "part-b.jsonl", {40: "{not json", 200: '{"text": "  "}'})
    return folder


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("ref") / "out"
    run(str(corpus), "-o", str(out), "--workers", "1", "--on-bad-record", "skip", *UNIT, *SHARD)
    digest = tree_digest(out)
    assert "rejects.jsonl" in digest and len([f for f in digest if f.endswith(".tar")]) > 2
    return digest


def plan(corpus: Path, out: Path, *extra: str) -> None:
    stdout, _ = run("plan", str(corpus), "-o", str(out), "--on-bad-record", "skip", *UNIT, *SHARD, *extra)  # fmt: skip
    # the plan fixes the special tokens, and says which, as the one-command convert does
    assert "  eos         '<|endoftext|>' (id 0) after every document" in stdout, stdout


def test_three_ranks_then_merge_equal_the_one_command_run(corpus, reference, tmp_path):
    out = tmp_path / "out"
    plan(corpus, out)
    stdout, _ = run("status", "-o", str(out), "--json", expect=3)
    before = json.loads(stdout)
    assert before["done"] == 0 and before["missing"] == before["units"] > 6

    ranks = [
        shardtok("run-units", "-o", str(out), "--rank", str(r), "--world-size", "3")
        for r in range(3)
    ]
    for proc in ranks:
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr

    stdout, _ = run("status", "-o", str(out), "--json")
    after = json.loads(stdout)
    assert after["complete"] and after["done"] == before["units"] and after["exit_code"] == 0
    stdout, _ = run("merge", "-o", str(out), "--jobs", "2")
    assert f"merged {before['units']:,} work units" in stdout
    assert not (out / WORK_DIR_NAME).exists()
    assert tree_digest(out) == reference
    stdout, _ = run("status", "-o", str(out))
    assert "merged" in stdout


def test_run_units_killed_mid_unit_then_rerun(corpus, reference, tmp_path):
    out = tmp_path / "out"
    plan(corpus, out)
    work = out / WORK_DIR_NAME
    proc = shardtok(
        "run-units", "-o", str(out), "--rank", "0", "--world-size", "1", "--workers", "1",
        start_new_session=True,
    )  # fmt: skip
    try:
        # A unit is being written once its scratch folder exists (or, at the latest, once a
        # first marker is there): kill the whole process group then.
        deadline = time.monotonic() + 60
        while not any(p.name.startswith((".scratch-", "unit-")) for p in work.iterdir()):
            assert proc.poll() is None, "run-units finished before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.002)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    done_before = len(list(work.glob("unit-*.json")))

    stdout, _ = run("status", "-o", str(out), "--json", expect=3)
    assert json.loads(stdout)["done"] == done_before
    stdout, _ = run("run-units", "-o", str(out), "--rank", "0", "--world-size", "1")
    assert f"{done_before:,} already done" in stdout
    run("merge", "-o", str(out))
    assert tree_digest(out) == reference


def test_two_copies_of_one_rank_at_once(corpus, reference, tmp_path):
    out = tmp_path / "out"
    plan(corpus, out)
    args = ("run-units", "-o", str(out), "--rank", "0", "--world-size", "1", "--workers", "1")
    twins = [shardtok(*args), shardtok(*args)]
    for proc in twins:
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
    run("status", "-o", str(out))
    run("merge", "-o", str(out))
    assert tree_digest(out) == reference


def _failing_unit(out: Path, file: str, offset: int) -> int:
    """The unit whose piece of `file` holds byte `offset`, from the plan."""
    doc = json.loads((out / WORK_DIR_NAME / "plan.json").read_text())
    paths = [f["path"] for f in doc["job"]["inputs"]]
    for index, _, pieces in doc["job"]["units"]:
        for input_index, start, end, *_ in pieces:
            if paths[input_index].endswith(file) and start <= offset < end:
                return index
    raise AssertionError("no unit holds the offset")


def test_a_bad_record_is_reported_like_the_one_command_run(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_corpus(corpus / "a.jsonl", 300, seed=3)
    write_corpus(corpus / "b.jsonl", 300, seed=4)
    insert_lines(corpus / "b.jsonl", {250: '{"text": ""}'})
    _, one_command = run(
        str(corpus), "-o", str(tmp_path / "one"), "--workers", "1", *UNIT, expect=1
    )
    error = one_command.strip().splitlines()[-1]
    assert error.startswith("shardtok convert: error: ") and "b.jsonl, line 250: empty" in error

    out = tmp_path / "out"
    run("plan", str(corpus), "-o", str(out), *UNIT)
    bad_offset = len("".join((corpus / "b.jsonl").read_text().splitlines(True)[:249]))
    failing = _failing_unit(out, "b.jsonl", bad_offset)
    assert failing >= 1, "the test needs units before the failing one"

    # The failing unit's rank first: the units before it are not all done, so the failure is
    # named by unit and piece, and the rank exits 1.
    rank = failing % 2
    _, stderr = run("run-units", "-o", str(out), "--rank", str(rank), "--world-size", "2", expect=1)
    assert f"(work unit {failing})" in stderr and "empty_document" in stderr
    stdout, _ = run("status", "-o", str(out), "--json", expect=1)
    found = json.loads(stdout)
    assert found["failure_unit"] == failing and found["failed"] == 1 and not found["complete"]
    assert f"(work unit {failing})" in found["failure"]

    # Once every unit before it is done: the file's line, exactly as the one-command run says.
    # The other rank leaves its units after the failing one undone, and says why.
    _, stderr = run(
        "run-units", "-o", str(out), "--rank", str(1 - rank), "--world-size", "2", expect=1
    )
    assert stderr.strip().splitlines()[-1] == error
    stdout, _ = run("status", "-o", str(out), expect=1)
    assert f"first failure: {error.removeprefix('shardtok convert: error: ')}" in stdout
    _, stderr = run("merge", "-o", str(out), expect=1)
    assert stderr.strip().splitlines()[-1] == error

    # Skipping instead keeps the finished units: only the failed one and those after it are
    # tokenized.
    run("plan", str(corpus), "-o", str(out), *UNIT, "--on-bad-record", "skip")
    stdout, _ = run("status", "-o", str(out), "--json", expect=3)
    found = json.loads(stdout)
    assert found["failed"] == 0 and found["first_missing"] == failing and found["done"] > 0
    stdout, _ = run("run-units", "-o", str(out), "--rank", "0", "--world-size", "1")
    assert f"{found['done']:,} already done, {found['missing']:,} tokenized" in stdout
    run("merge", "-o", str(out))
    rejects = (out / "rejects.jsonl").read_text().splitlines()
    assert [json.loads(r)["line"] for r in rejects] == [250]


@pytest.mark.parametrize(
    "words, expected",
    [
        (("convert",), ["shardtok convert plan INPUT", "./plan", "--engine", "--scheduler"]),
        (
            ("convert", "plan"),
            [
                '--rank "$SLURM_ARRAY_TASK_ID"',
                '--world-size "$SLURM_ARRAY_TASK_COUNT"',
                "sbatch",
                "reads no environment variables",
            ],
        ),  # fmt: skip
        (("convert", "status"), ["exit status", "3  units are still to be done", "--json"]),
        (("convert", "run-units"), ["--rank R", "--world-size W", "--workers N"]),
        (("convert", "merge"), ["--jobs N", "--keep-work"]),
    ],
)
def test_help(words, expected, capsys):
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args([*words, "--help"])
    assert stop.value.code == 0
    text = capsys.readouterr().out
    for piece in expected:
        assert piece in text, piece


def test_phase_words_dispatch_and_an_input_named_plan(tmp_path):
    parser = build_parser()
    args = parser.parse_args(
        ["convert", "run-units", "-o", "o", "--rank", "1", "--world-size", "4"]
    )
    assert (args.rank, args.world_size, args.workers) == (1, 4, 0)
    args = parser.parse_args(["convert", "./plan", "-o", "o", "--engine", "dask"])
    assert args.inputs == ["./plan"] and args.engine == "dask" and args.scheduler is None
    args = parser.parse_args(["convert", "plan", "./plan", "-o", "o", "--unit-size", "1MiB"])
    assert args.inputs == ["./plan"] and args.unit_size == 1 << 20
