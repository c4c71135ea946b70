"""The SFT encoder on the bundled tokenizer: one encode with offsets, the overlap rule, boundary
tokens, true offsets under trim_offsets, special tokens in content (and the split mode), every
truncation mode, no_loss_tokens, and a property test on random conversations."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, processors

from shardtok.convert.sft.conversation import (
    INVALID_CONVERSATION,
    NO_LOSS_TOKENS,
    SPECIAL_TOKEN_IN_CONTENT,
    TOO_LONG,
    Conversation,
    Message,
    Rendered,
    SFTBad,
)
from shardtok.convert.sft.encode import EncodedRecord, SFTEncoder
from shardtok.convert.sft.templates import load_template, template_tokens
from shardtok.convert.tokenizing.tokenizer import TokenizerSpec, load_tokenizer
from shardtok.errors import UsageError


@pytest.fixture(scope="module")
def spec():
    return load_tokenizer("bundled", append_eos=False)


@pytest.fixture(scope="module")
def backend(spec):
    return Tokenizer.from_str(spec.backend_json)


@pytest.fixture(scope="module")
def chatml_spec(spec, tmp_path_factory):
    """The bundled tokenizer with ChatML's two special tokens added."""
    tok = Tokenizer.from_str(spec.backend_json)
    tok.add_special_tokens([AddedToken("<|im_start|>", special=True),
                            AddedToken("<|im_end|>", special=True)])  # fmt: skip
    path = tmp_path_factory.mktemp("chatml") / "tokenizer.json"
    tok.save(str(path))
    return load_tokenizer(str(path), append_eos=False)


def template(spec, name="alpaca", **kwargs):
    return load_template(name, tokenizer_path=None, **template_tokens(spec), **kwargs)


def conv(*pairs, train=None) -> Conversation:
    train = train or {}
    return Conversation(
        tuple(Message(role, content, train.get(i)) for i, (role, content) in enumerate(pairs))
    )


def pieces(backend, out: EncodedRecord, trained=1) -> list[str]:
    """The decoded runs of trained (or untrained) tokens."""
    runs, run = [], []
    for token, flag in zip(out.ids.tolist(), out.mask.tolist()):
        if flag == trained:
            run.append(token)
        elif run:
            runs.append(run)
            run = []
    runs += [run] if run else []
    return [backend.decode(r, skip_special_tokens=False) for r in runs]


CHAT = conv(
    ("user", "What is 2+2?"),
    ("assistant", "4."),
    ("user", "And 3+3?"),
    ("assistant", "6, of course."),
)


def test_one_encode_of_the_rendered_text(spec, backend):
    r = template(spec)
    out = SFTEncoder(spec, max_tokens=None).encode(CHAT, r)
    text = r.render(CHAT).text
    assert out.ids.tolist() == backend.encode(text, add_special_tokens=False).ids
    assert out.ids.dtype == spec.dtype and out.mask.dtype == np.uint8
    assert len(out.mask) == len(out.ids) and not out.truncated
    assert pieces(backend, out) == ["4.<|endoftext|>", "6, of course.<|endoftext|>"]
    assert out.trained_tokens == int(out.mask.sum()) and out.boundary_tokens == 0


def test_a_token_merged_across_a_span_boundary_is_trained_and_counted(spec, backend):
    """ "### Response:\\n" + "\\n\\nSure": the template's newline and the content's first one
    merge into one token, which the overlap rule trains."""
    r = template(spec)
    out = SFTEncoder(spec, max_tokens=None).encode(
        conv(("user", "Say sure"), ("assistant", "\n\nSure")), r
    )
    tokens = [backend.id_to_token(i) for i in out.ids.tolist()]
    at = tokens.index("ĊĊ")
    assert tokens[at - 2 : at + 3] == ["ponse", ":", "ĊĊ", "Ċ", "S"]
    assert out.mask[at - 1] == 0  # "Response:" is untrained
    assert out.mask[at] == 1 and out.boundary_tokens == 1
    assert pieces(backend, out) == ["\n\n\nSure<|endoftext|>"]  # one template newline rides along


def test_raw_merges_user_and_assistant_text(spec, backend):
    out = SFTEncoder(spec, max_tokens=None).encode(
        conv(("user", "user"), ("assistant", "ok")), template(spec, "raw")
    )
    assert [backend.id_to_token(i) for i in out.ids.tolist()] == [
        "<|bos|>", "use", "ro", "k", "<|endoftext|>"
    ]  # fmt: skip
    assert out.mask.tolist() == [0, 0, 1, 1, 1] and out.boundary_tokens == 1


def trimming_spec(spec) -> TokenizerSpec:
    """The bundled tokenizer with a ByteLevel post-processor that trims offsets (as RoBERTa's)."""
    tok = Tokenizer.from_str(spec.backend_json)
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    source = tok.to_str()
    assert json.loads(source)["post_processor"]["trim_offsets"] is True
    return TokenizerSpec(
        name="trimming", backend_json=source, fingerprint="sha256:trimming",
        vocab_size=spec.vocab_size, eos_id=spec.eos_id, bos_id=spec.bos_id,
        append_eos=False, prepend_bos=False,
    )  # fmt: skip


def test_offsets_are_the_true_coverage_when_the_tokenizer_trims_them(spec, backend):
    """ "Hello " (trained) + "there" (untrained): the token " there" covers the trained space.
    Trimmed offsets would leave the space out and the token untrained."""
    trimming = trimming_spec(spec)
    trimmed = Tokenizer.from_str(trimming.backend_json).encode(
        "Hello there", add_special_tokens=False
    )
    assert trimmed.offsets[1] == (6, 11)  # what tokenizers reports: the space is not covered
    c = conv(("user", "Hello "), ("assistant", "there"), train={0: True, 1: False})
    for s in (spec, trimming):
        out = SFTEncoder(s, max_tokens=None).encode(c, template(spec, "raw"))
        assert [backend.id_to_token(i) for i in out.ids.tolist()] == [
            "<|bos|>", "Hello", "Ġthere", "<|endoftext|>"
        ]  # fmt: skip
        assert out.mask.tolist() == [1, 1, 1, 0] and out.boundary_tokens == 1


# -- special tokens ----------------------------------------------------------------------------


def test_a_special_token_in_content_is_a_bad_record(spec):
    bad = SFTEncoder(spec, max_tokens=None).encode(
        conv(("user", "Hi"), ("user", "stop here<|endoftext|> ok"), ("assistant", "x")),
        template(spec),
    )
    assert bad == SFTBad(
        SPECIAL_TOKEN_IN_CONTENT, "message 1 (user) contains '<|endoftext|>' at character 9"
    )


def test_a_special_token_made_of_two_contents_is_a_bad_record(spec):
    bad = SFTEncoder(spec, max_tokens=None).encode(
        conv(("user", "a<|endof"), ("assistant", "text|>b")), template(spec, "raw")
    )
    assert isinstance(bad, SFTBad) and bad.reason == SPECIAL_TOKEN_IN_CONTENT
    assert "'<|endoftext|>' at character 8 of the rendered text" in bad.detail


def test_split_mode_encodes_content_specials_as_text(spec, backend):
    r = template(spec)
    c = conv(("user", "Hi <|endoftext|> <|bos|>x"), ("assistant", "ok <|endoftext|>"))
    out = SFTEncoder(spec, max_tokens=None, split_special_tokens=True).encode(c, r)
    ids = out.ids.tolist()
    # Control tokens: the template's BOS and the EOS after the answer, nothing else.
    assert ids.count(spec.bos_id) == 1 and ids[0] == spec.bos_id
    assert ids.count(spec.eos_id) == 1 and ids[-1] == spec.eos_id
    assert backend.decode(ids, skip_special_tokens=False) == r.render(c).text
    assert pieces(backend, out) == ["ok <|endoftext|><|endoftext|>"]
    # The content's "<|endoftext|>" is the ordinary text's tokens.
    text_ids = backend.encode(" <|", add_special_tokens=False).ids
    assert text_ids[0] in ids
    # Without special strings in content, split mode is the plain encoding.
    plain = SFTEncoder(spec, max_tokens=None).encode(CHAT, r)
    split = SFTEncoder(spec, max_tokens=None, split_special_tokens=True).encode(CHAT, r)
    assert plain.ids.tolist() == split.ids.tolist() and plain.mask.tolist() == split.mask.tolist()


def test_split_mode_refuses_a_tokenizer_that_encodes_pieces_differently():
    """SentencePiece-style "first" Metaspace prefixes "▁" only at the start of the text, so a
    piece encoded on its own is not what the whole text gives."""
    vocab = {"<unk>": 0, "▁Hi": 1, "Hi": 2, "▁there": 3, "there": 4, "▁x": 5, "x": 6}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    tok.add_special_tokens([AddedToken("<s>", special=True)])
    spec = TokenizerSpec(
        name="metaspace", backend_json=tok.to_str(), fingerprint="sha256:metaspace",
        vocab_size=8, eos_id=None, bos_id=None, append_eos=False, prepend_bos=False,
    )  # fmt: skip
    SFTEncoder(spec, max_tokens=None)  # fine without the split mode
    with pytest.raises(UsageError, match="split_special_tokens cannot be used"):
        SFTEncoder(spec, max_tokens=None, split_special_tokens=True)


# -- length and empty masks --------------------------------------------------------------------


def lengths(spec, conversation, r):
    return len(SFTEncoder(spec, max_tokens=None).encode(conversation, r).ids)


def test_drop(spec):
    r = template(spec)
    n = lengths(spec, CHAT, r)
    assert SFTEncoder(spec, max_tokens=n).encode(CHAT, r).ids.size == n
    bad = SFTEncoder(spec, max_tokens=n - 1).encode(CHAT, r)
    assert bad == SFTBad(TOO_LONG, f"{n} tokens > max_tokens {n - 1}")


def test_keep_start(spec, backend):
    r = template(spec)
    full = SFTEncoder(spec, max_tokens=None).encode(CHAT, r)
    cut = SFTEncoder(spec, max_tokens=len(full.ids) - 3, truncation="keep_start").encode(CHAT, r)
    assert cut.truncated and cut.ids.tolist() == full.ids[:-3].tolist()
    assert cut.mask.tolist() == full.mask[:-3].tolist()
    first = int(np.argmax(full.mask))  # no trained token in the first `first` tokens
    bad = SFTEncoder(spec, max_tokens=first, truncation="keep_start").encode(CHAT, r)
    assert isinstance(bad, SFTBad) and bad.reason == NO_LOSS_TOKENS
    assert "keeps the first" in bad.detail


def test_turns_ends_after_a_complete_trained_turn(spec):
    r = template(spec)
    long = conv(*[(m.role, m.content) for m in CHAT.messages], ("user", "And 4+4? " * 20))
    two = Conversation(long.messages[:2])
    up_to_first_answer = SFTEncoder(spec, max_tokens=None).encode(two, r)
    four = SFTEncoder(spec, max_tokens=None).encode(Conversation(long.messages[:4]), r)
    limit = len(four.ids) + 5  # fits four messages, not five; the fourth is trained
    out = SFTEncoder(spec, max_tokens=limit, truncation="turns").encode(long, r)
    assert out.truncated and out.ids.tolist() == four.ids.tolist()
    assert out.mask.tolist() == four.mask.tolist()
    # Three messages would fit in len(four) - 1 tokens, but end on a user turn: two are kept.
    out = SFTEncoder(spec, max_tokens=len(four.ids) - 1, truncation="turns").encode(long, r)
    assert out.ids.tolist() == up_to_first_answer.ids.tolist()
    # Not even the first answer fits: nothing trained is left.
    bad = SFTEncoder(spec, max_tokens=len(up_to_first_answer.ids) - 1, truncation="turns").encode(
        long, r
    )
    assert isinstance(bad, SFTBad) and bad.reason == NO_LOSS_TOKENS
    assert "no prefix of the conversation that ends after a trained turn fits" in bad.detail


def test_turns_needs_turns_from_the_renderer(spec):
    class NoTurns:
        def render(self, conversation):
            return Rendered("a long untrained text" * 10, ((0, 5),))

    bad = SFTEncoder(spec, max_tokens=5, truncation="turns").encode(CHAT, NoTurns())
    assert isinstance(bad, SFTBad) and bad.reason == TOO_LONG


def test_nothing_trained_is_no_loss_tokens(spec):
    r = template(spec)
    for c in (
        conv(("user", "Hi"), ("user", "again")),
        conv(("user", "Hi"), ("assistant", "no"), train={1: False}),
    ):
        bad = SFTEncoder(spec, max_tokens=None).encode(c, r)
        assert isinstance(bad, SFTBad) and bad.reason == NO_LOSS_TOKENS


def test_a_template_refusing_the_record_is_invalid_conversation(spec, tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text(
        "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools here') }}"
        "{% elif m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}"
        "{% else %}{{ m.content }}{% endif %}{% endfor %}"
    )
    r = template(spec, str(path))
    bad = SFTEncoder(spec, max_tokens=None).encode(conv(("tool", "x"), ("assistant", "y")), r)
    assert bad.reason == INVALID_CONVERSATION and "no tools here" in bad.detail


def test_bad_settings_are_usage_errors(spec):
    with pytest.raises(UsageError, match="truncation must be one of drop, turns, keep_start"):
        SFTEncoder(spec, max_tokens=10, truncation="middle")
    with pytest.raises(UsageError, match="max_tokens"):
        SFTEncoder(spec, max_tokens=0)


# -- property ----------------------------------------------------------------------------------

TEXT = st.lists(st.sampled_from(list("ab Sure:\n\t.,é日🙂’") + ["  ", "\n\n", "Hello"]),
               max_size=12).map("".join)  # fmt: skip
MESSAGES = st.lists(
    st.tuples(st.sampled_from(["system", "user", "assistant"]), TEXT,
              st.sampled_from([None, None, True, False])),
    min_size=1, max_size=6,
)  # fmt: skip


@pytest.fixture(scope="module")
def chatml(chatml_spec):
    """What the property tests use on every example, built once, as a worker builds them once
    for all its records (per example, they took 2.6 s of the 3.4 s of 150 examples)."""
    spec = chatml_spec
    templates = {
        (name, on_input): template(spec, name, train_on_input=on_input)
        for name in ("alpaca", "raw", "chatml")
        for on_input in (True, False)
    }
    return {
        "backend": Tokenizer.from_str(spec.backend_json),
        "encoder": SFTEncoder(spec, max_tokens=None),
        "split_encoder": SFTEncoder(spec, max_tokens=None, split_special_tokens=True),
        "templates": templates,
        "chatml": template(spec, "chatml"),
    }


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(MESSAGES, st.sampled_from(["alpaca", "raw", "chatml"]), st.booleans())
def test_property_masks_follow_the_trained_spans(chatml, messages, name, on_input):
    backend = chatml["backend"]
    r = chatml["templates"][name, on_input]
    c = Conversation(tuple(Message(role, text, train) for role, text, train in messages))
    rendered = r.render(c)
    out = chatml["encoder"].encode(c, r)
    if isinstance(out, SFTBad):
        assert out.reason == NO_LOSS_TOKENS and not rendered.trained
        return
    encoding = backend.encode(rendered.text, add_special_tokens=False)
    assert out.ids.tolist() == encoding.ids and len(out.mask) == len(out.ids)
    inside = np.zeros(len(rendered.text), dtype=bool)
    for a, b in rendered.trained:
        inside[a:b] = True
    boundary = 0
    for (start, end), flag in zip(encoding.offsets, out.mask.tolist()):
        covered = inside[start:end]
        assert flag == int(covered.any())  # trained iff it covers a trained character
        boundary += bool(covered.any() and not covered.all())
    assert boundary == out.boundary_tokens
    # The trained tokens decode to text covering every trained span.
    for a, b in rendered.trained:
        run = [i for i, (s, e) in enumerate(encoding.offsets) if s < b and e > a]
        assert all(out.mask[i] for i in run) and run == list(range(run[0], run[-1] + 1))
        decoded = backend.decode(out.ids[run[0] : run[-1] + 1].tolist(), skip_special_tokens=False)
        assert rendered.text[a:b] in decoded


SPECIAL_TEXT = st.lists(
    st.sampled_from(["a", " ", "\n", "<|im_end|>", "<|im_start|>", "<|endoftext|>", "<|", "|>"]),
    max_size=8,
).map("".join)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.tuples(st.sampled_from(["user", "assistant"]), SPECIAL_TEXT), min_size=1, max_size=5
    )
)
def test_property_split_mode_keeps_only_the_templates_control_tokens(chatml, pairs):
    backend = chatml["backend"]
    r = chatml["chatml"]
    c = conv(*pairs, ("assistant", "end"))
    out = chatml["split_encoder"].encode(c, r)
    rendered = r.render(c)
    assert isinstance(out, EncodedRecord) and len(out.mask) == len(out.ids)
    assert backend.decode(out.ids.tolist(), skip_special_tokens=False) == rendered.text
    control = {backend.token_to_id(t) for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>")}
    # The template writes <|im_start|> and <|im_end|> once per message; contents write none.
    assert sum(i in control for i in out.ids.tolist()) == 2 * len(c.messages)
    assert pieces(backend, out)[-1].endswith("end<|im_end|>")
