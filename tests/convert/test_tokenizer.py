"""Tokenizer loading: folders and bare tokenizer.json, EOS/BOS, fingerprint, dtype by vocabulary size."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

from shardtok.convert import ConvertJob, RunOptions, convert, load_tokenizer
from shardtok.convert.tokenizing.encoder import BatchEncoder
from shardtok.convert.tokenizing.tokenizer import BUNDLED_PATH, TokenizerLoadError
from shardtok.format.manifest import load_manifest
from shardtok.format.shard_reader import ShardReader
from shardtok.storage import open_source


def word_level(folder: Path, vocab_size: int, eos: str | None = "<|endoftext|>") -> Path:
    """A tokenizer.json with exactly `vocab_size` ids: w0 ... plus an EOS as the last id."""
    folder.mkdir(parents=True, exist_ok=True)
    words = vocab_size - (eos is not None)
    vocab = {f"w{i}": i for i in range(words)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if eos is not None:
        tokenizer.add_special_tokens([AddedToken(eos, special=True)])
    path = folder / "tokenizer.json"
    tokenizer.save(str(path))
    return path


@pytest.mark.parametrize("vocab_size, dtype", [(65500, np.uint16), (65501, np.int32)])
def test_dtype_switches_at_the_vocabulary_boundary(tmp_path, vocab_size, dtype):
    path = word_level(tmp_path / "tok", vocab_size)
    spec = load_tokenizer(str(path))
    assert spec.vocab_size == vocab_size and spec.eos_id == vocab_size - 1
    top = f"w{vocab_size - 2}"
    (tmp_path / "c.jsonl").write_text(json.dumps({"text": f"w0 w1 {top} w7"}) + "\n")
    out = tmp_path / "out"
    convert(
        ConvertJob(inputs=(str(tmp_path / "c.jsonl"),), output=str(out), tokenizer=spec),
        RunOptions(workers=1, progress=False),
    )
    manifest = load_manifest(out)
    assert manifest.dtype == np.dtype(dtype) and manifest.vocab_size == vocab_size
    reader = ShardReader(open_source(out / manifest.shards[0].file))
    assert reader.meta.dtype == np.dtype(dtype)
    assert reader.document(0).tolist() == [0, 1, vocab_size - 2, 7, vocab_size - 1]


def test_bare_tokenizer_json_without_eos(tmp_path):
    path = word_level(tmp_path / "tok", 100, eos=None)
    with pytest.raises(TokenizerLoadError, match="no EOS token.*--eos-token"):
        load_tokenizer(str(path))
    assert load_tokenizer(str(path), append_eos=False).eos_id is None
    assert load_tokenizer(str(path), eos_token="w5").eos_id == 5
    with pytest.raises(TokenizerLoadError, match="not in the tokenizer's vocabulary"):
        load_tokenizer(str(path), eos_token="<nope>")
    with pytest.raises(TokenizerLoadError, match="no BOS token"):
        load_tokenizer(str(path), append_eos=False, prepend_bos=True)


def test_missing_tokenizer_is_a_clear_error(tmp_path):
    with pytest.raises(TokenizerLoadError, match="not found"):
        load_tokenizer(str(tmp_path / "nowhere"))


def test_bundled_tokenizer_loads_as_folder_file_and_default(tmp_path):
    bundled = load_tokenizer("bundled")
    folder = load_tokenizer(str(BUNDLED_PATH))
    assert bundled.fingerprint == folder.fingerprint and bundled.fingerprint.startswith("sha256:")
    assert (bundled.vocab_size, bundled.eos_id, bundled.bos_id) == (8192, 0, 1)
    assert bundled.name == "shardtok-bpe-8k" and folder.name == "tokenizer"
    bare = load_tokenizer(
        str(BUNDLED_PATH / "tokenizer.json")
    )  # EOS found by its conventional name
    assert (bare.eos_id, bare.fingerprint) == (0, bundled.fingerprint)
    assert (BUNDLED_PATH / "tokenizer.json").stat().st_size < 2 << 20


def test_fingerprint_changes_with_the_tokenizer(tmp_path):
    a = load_tokenizer(str(word_level(tmp_path / "a", 100)))
    b = load_tokenizer(str(word_level(tmp_path / "b", 101)))
    assert a.fingerprint != b.fingerprint
    assert a.as_metadata() == {
        "name": "a",
        "fingerprint": a.fingerprint,
        "eos_id": 99,
        "bos_id": None,
    }


def test_batch_encoder_matches_per_document_encode():
    spec = load_tokenizer("bundled", prepend_bos=True)
    encoder = BatchEncoder(spec)
    backend = Tokenizer.from_file(str(BUNDLED_PATH / "tokenizer.json"))
    texts = ["first doc", "x", "a longer document with several words\nand lines", "é"]
    tokens, sizes = encoder.encode(texts)
    expected = [[1, *backend.encode(t, add_special_tokens=False).ids, 0] for t in texts]
    assert sizes.tolist() == [len(e) for e in expected]
    assert tokens.tolist() == [i for e in expected for i in e]
    assert tokens.dtype == np.uint16
