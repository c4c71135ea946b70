"""Class 5: a mix of datasets made with different tokenizers would stream ids past the other
vocabulary; it is refused naming both tokenizers unless explicitly allowed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from shardtok.errors import UsageError
from shardtok.format import DatasetWriter
from shardtok.torch import ShardStreamDataset

REPO = Path(__file__).resolve().parents[2]
OPTIONS = dict(seq_len=15, batch_size=2, num_batches=4)


def dataset(path: Path, fingerprint: str | None, vocab_size: int) -> str:
    rng = np.random.default_rng(vocab_size)
    tokenizer = None if fingerprint is None else {"name": f"tok-{fingerprint}",
                                                  "fingerprint": fingerprint}  # fmt: skip
    with DatasetWriter(path, vocab_size=vocab_size, tokenizer=tokenizer) as writer:
        for _ in range(120):
            writer.add(rng.integers(0, vocab_size, size=int(rng.integers(5, 80))))
    return str(path)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokenizers")
    return {
        "a": dataset(root / "a", "sha256:aaaa", 1000),
        "a2": dataset(root / "a2", "sha256:aaaa", 1000),
        "b": dataset(root / "b", "sha256:bbbb", 1000),
        "small": dataset(root / "small", None, 500),
        "plain": dataset(root / "plain", None, 1000),
    }


@pytest.mark.parametrize("other", ["b", "small", "plain"])
def test_different_tokenizers_are_refused_naming_both(paths, other):
    with pytest.raises(UsageError, match="tokenized differently") as caught:
        ShardStreamDataset({paths["a"]: 1, paths[other]: 1}, **OPTIONS)
    message = str(caught.value)
    assert "'tok-sha256:aaaa' (sha256:aaaa), vocabulary 1,000" in message
    assert paths[other] in message and "--allow-mixed-tokenizers" in message


def test_the_same_tokenizer_mixes(paths):
    ds = ShardStreamDataset({paths["a"]: 1, paths["a2"]: 2}, **OPTIONS)
    assert len(list(ds)) == 4


def test_the_override_is_explicit_in_python_yaml_and_cli(paths, tmp_path):
    ShardStreamDataset({paths["a"]: 1, paths["b"]: 1}, allow_mixed_tokenizers=True, **OPTIONS)
    config = tmp_path / "mix.yaml"
    config.write_text(f"dataset_path:\n  {paths['a']}: 1\n  {paths['b']}: 1\n")
    with pytest.raises(UsageError, match="tokenized differently"):
        ShardStreamDataset.from_config(config, **OPTIONS)
    config.write_text(config.read_text() + "allow_mixed_tokenizers: true\n")
    ShardStreamDataset.from_config(config, **OPTIONS)
    args = [sys.executable, "-m", "shardtok", "stream", "--source", f"{paths['a']}:1",
            "--source", f"{paths['b']}:1", "--seq-len", "15", "--batch-size", "2",
            "--max-batches", "2"]  # fmt: skip
    refused = subprocess.run(args, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert refused.returncode == 2 and "tokenized differently" in refused.stderr
    assert "Traceback" not in refused.stderr
    allowed = subprocess.run([*args, "--allow-mixed-tokenizers"], capture_output=True, text=True,
                             cwd=REPO, timeout=120)  # fmt: skip
    assert allowed.returncode == 0, allowed.stderr
