"""The bytes every engine writes, against those shardtok 0.3.0 wrote for the same inputs.

The convert layer's drivers (the one-command run, the phases a scheduler runs, the dask engine)
share one plan and one shard-assembly path; these fixtures pin that what they write stayed the
bytes of the release before that was so: text and fine-tuning records, both tokenizer backends,
one and two workers, two ranks, rejects. Each digest covers every file of the output folder.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pytest

from shardtok.cli.main import main

SMALL = ["-q", "--unit-size", "64KiB", "--shard-size", "64KiB"]

# sha256 of every (file name, bytes) of the output. Written by shardtok 0.3.0 (57e7170), whose
# dask engine matched its one-command run (text-dask: that run's digest).
TEXT = "93dcbbb0dfcff549278994c92339af6ffe570d093da13733d870ef27b8be89a1"
SFT = "f93f86cc456802e47563b070b8cc4631e7367414a4bbcf312550098efdc28c97"
GOLDEN = {
    "text-hf-1": TEXT,
    "text-tiktoken-2": TEXT,
    "text-ranks": TEXT,
    "text-dask": TEXT,
    "text-skip-2": "2f8dc8d24151cbb605097f8cf15970e17532b29142b1836a074431fe485de2e2",
    "sft-1": SFT,
    "sft-2": SFT,
    "sft-ranks": SFT,
}


def _words(rng: random.Random) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(1, 9))) for _ in range(2000)]
    # Scripts and normalisation-sensitive text: the backends must agree on them too.
    return words + ["naïve", "Ünïcödé", "東京", "данные", "مرحبا", "e\u0301", "ﬁ", "①", "🙂", "\t"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    rng = random.Random(37)
    words = _words(rng)
    root = tmp_path_factory.mktemp("golden")
    with open(root / "a.jsonl", "w", encoding="utf-8") as f:
        for i in range(900):
            text = " ".join(rng.choice(words) for _ in range(rng.randint(5, 120)))
            f.write(json.dumps({"text": text}) + "\n")
            if i == 450:
                f.write('{"text": ""}\n')  # a bad record (empty text)
    with open(root / "b.txt", "w", encoding="utf-8") as f:
        for _ in range(400):
            f.write(" ".join(rng.choice(words) for _ in range(rng.randint(3, 60))) + "\n")
    with open(root / "chat.jsonl", "w", encoding="utf-8") as f:
        for _ in range(400):
            messages = []
            for _turn in range(rng.randint(1, 3)):
                for role in ("user", "assistant"):
                    text = " ".join(rng.choice(words) for _ in range(rng.randint(1, 40)))
                    messages.append({"role": role, "content": text})
            f.write(json.dumps({"messages": messages}) + "\n")
    (root / "chat.yaml").write_text("format: openai\ntemplate: alpaca\n")
    return root


def digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        if path.is_file():
            h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _run(*args: str) -> None:
    assert main(list(args)) == 0


def _convert(case: str, out: Path) -> None:
    # Relative input paths: the manifest and rejects.jsonl name the inputs as given.
    text = ["a.jsonl", "b.txt", "--txt-mode", "lines"]
    sft = ["chat.jsonl", "--sft", "chat.yaml"]
    skip = ["--on-bad-record", "skip"]
    o = ["-o", str(out)]
    if case == "text-hf-1":
        _run("convert", *text, *o, *SMALL, *skip, "--tokenizer-backend", "hf", "--workers", "1")
    elif case == "text-tiktoken-2":
        _run(
            "convert", *text, *o, *SMALL, *skip, "--tokenizer-backend", "tiktoken", "--workers", "2"
        )
    elif case == "text-skip-2":
        _run("convert", *text, *o, *SMALL, *skip, "--workers", "2", "--compression-level", "9")
    elif case in ("text-ranks", "sft-ranks"):
        what = text + skip if case == "text-ranks" else sft
        _run("convert", "plan", *what, *o, *SMALL)
        for rank in (1, 0):
            _run("convert", "run-units", *o, "--rank", str(rank), "--world-size", "2", "-q")
        _run("convert", "merge", *o, "-q", "--jobs", "2")
    elif case in ("sft-1", "sft-2"):
        _run("convert", *sft, *o, *SMALL, "--workers", case[-1])
    elif case == "text-dask":
        _run("convert", *text, *o, *SMALL, *skip, "--engine", "dask", "--workers", "2")
    else:
        raise AssertionError(case)


@pytest.mark.parametrize("case", sorted(GOLDEN))
def test_the_bytes_of_0_3_0(case, inputs, tmp_path, monkeypatch):
    if case == "text-dask":
        pytest.importorskip("distributed")
    monkeypatch.chdir(inputs)
    out = tmp_path / "out"
    _convert(case, out)
    assert digest(out) == GOLDEN[case], case
