"""The built-in ``qwen3``: Qwen3's own rendering with thinking off (the stock template, no
generation prompt, ``enable_thinking=False``), each answer and its ``<|im_end|>`` trained, the
last answer's empty think block not; against the fixture's stock template always, and against
transformers' ``apply_chat_template`` on the npm Qwen3 tokenizer when
tools/install-test-servers.sh could fetch it."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardtok.convert.sft.conversation import Conversation, Message
from shardtok.convert.sft.encode import SFTEncoder
from shardtok.convert.sft.jinja_env import compile_template, render_tracked
from shardtok.convert.sft.templates import RenderRefused, load_template, template_tokens
from shardtok.convert.tokenizing.tokenizer import load_tokenizer
from tests.helpers.sft_data import CHATS, chat, decoded_runs

FIXTURES = Path(__file__).parent / "fixtures"
QWEN3_STOCK = (FIXTURES / "qwen3_chat_template.jinja").read_text()
QWEN3_FOLDER = Path(__file__).parents[2] / ".tokenizers" / "qwen3"
QWEN3_TOKENS = {
    "special_tokens": {"<|endoftext|>", "<|im_start|>", "<|im_end|>"},
    "bos_token": None,
    "eos_token": "<|im_end|>",
}
THINK = "<think>\n\n</think>\n\n"


CONVERSATIONS = [
    *CHATS,
    chat(
        ("user", "\n leading"), ("assistant", "\n\nSure"), ("user", "x"), ("assistant", "\n Sure  ")
    ),
    chat(("system", "s"), ("user", "q"), ("assistant", "a1"), ("assistant", "a2")),
    chat(("user", "q"), ("assistant", "a"), ("user", "ends with a question")),
]


def conversation(messages):
    return Conversation(tuple(Message(m["role"], m["content"]) for m in messages))


def stock(messages):
    text, _ = render_tracked(
        compile_template(QWEN3_STOCK), messages, enable_thinking=False, add_generation_prompt=False
    )
    return text


def answers(messages):
    """What is trained: each answer and <|im_end|>; the last message, an answer after the last
    user message, loses its leading newlines as Qwen3's template writes it."""
    out = []
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            last = i == len(messages) - 1 and any(x["role"] == "user" for x in messages)
            out.append((m["content"].lstrip("\n") if last else m["content"]) + "<|im_end|>")
    return out


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_renders_as_qwen3s_own_template(messages):
    r = load_template("qwen3", tokenizer_path=None, **QWEN3_TOKENS)
    out = r.render(conversation(messages))
    assert out.text == stock(messages)
    assert [out.text[a:b] for a, b in out.trained] == answers(messages)
    # The turns tile the text, in order, each holding its own message's content.
    assert out.turns[0][0] == 0 and out.turns[-1][1] == len(out.text)
    assert all(a[1] == b[0] for a, b in zip(out.turns, out.turns[1:]))
    for (start, end, _), m in zip(out.turns, messages):
        assert m["content"].strip() in out.text[start:end]


def test_only_the_last_answer_gets_the_think_block():
    messages = CONVERSATIONS[1]
    text = (
        load_template("qwen3", tokenizer_path=None, **QWEN3_TOKENS)
        .render(conversation(messages))
        .text
    )
    assert text.count(THINK) == 1
    assert text.endswith("<|im_start|>assistant\n" + THINK + "6, obviously.<|im_end|>\n")
    assert "<|im_start|>assistant\n4<|im_end|>" in text


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["system", "user", "assistant"]),
            st.lists(st.sampled_from(["a", " ", "\n", "user", "é", "<"]), max_size=5).map("".join),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_any_conversation_renders_as_qwen3s_own(pairs):
    messages = chat(*pairs)
    r = load_template("qwen3", tokenizer_path=None, **QWEN3_TOKENS)
    out = r.render(conversation(messages))
    assert out.text == stock(messages)
    assert [text for a, b in out.trained if (text := out.text[a:b])] == [
        a for a in answers(messages) if a
    ]
    assert out.turns[0][0] == 0 and out.turns[-1][1] == len(out.text)
    assert all(a[1] == b[0] and a[0] <= a[1] for a, b in zip(out.turns, out.turns[1:]))


def test_an_answer_holding_a_think_block_is_refused():
    r = load_template("qwen3", tokenizer_path=None, **QWEN3_TOKENS)
    with pytest.raises(RenderRefused, match="</think>"):
        r.render(conversation(chat(("user", "q"), ("assistant", "<think>x</think>a"))))


def test_needs_the_chatml_tokens():
    from shardtok.errors import UsageError

    with pytest.raises(UsageError, match="qwen3.*needs <\\|im_start\\|>, <\\|im_end\\|>"):
        load_template(
            "qwen3", tokenizer_path=None, special_tokens={"<|endoftext|>"}, bos_token=None,
            eos_token="<|endoftext|>",
        )  # fmt: skip


def test_truncation_turns_keeps_qwen3s_rendering_of_the_prefix():
    """A prefix kept by ``truncation: turns`` is what Qwen3 renders for that shorter
    conversation: its last answer gets the think block."""
    spec = load_tokenizer("bundled", append_eos=False)
    tokens = {**template_tokens(spec), "special_tokens": QWEN3_TOKENS["special_tokens"]}
    r = load_template("qwen3", tokenizer_path=None, **tokens)
    messages = CONVERSATIONS[1]
    whole = SFTEncoder(spec, max_tokens=None).encode(conversation(messages), r)
    short = SFTEncoder(spec, max_tokens=None).encode(conversation(messages[:3]), r)
    assert len(short.ids) < len(whole.ids)
    cut = SFTEncoder(spec, max_tokens=len(short.ids), truncation="turns")
    out = cut.encode(conversation(messages), r)
    assert out.truncated
    assert out.ids.tolist() == short.ids.tolist() and out.mask.tolist() == short.mask.tolist()


# -- against transformers on the npm Qwen3 tokenizer ---------------------------------------------


@pytest.fixture(scope="module")
def qwen3():
    if not (QWEN3_FOLDER / "tokenizer.json").is_file():
        pytest.skip(f"{QWEN3_FOLDER} is missing: run tools/install-test-servers.sh (needs npm)")
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(QWEN3_FOLDER))
    spec = load_tokenizer(str(QWEN3_FOLDER), append_eos=False, backend="hf")
    renderer = load_template("qwen3", tokenizer_path=str(QWEN3_FOLDER), **template_tokens(spec))
    backend = Tokenizer.from_str(spec.backend_json)
    return tokenizer, renderer, SFTEncoder(spec, max_tokens=None), backend


@pytest.mark.parametrize("messages", [m for m in CONVERSATIONS if m[-1]["role"] == "assistant"])
def test_equals_apply_chat_template_on_the_npm_tokenizer(qwen3, messages):
    tokenizer, renderer, encoder, backend = qwen3
    expected = tokenizer.apply_chat_template(messages, tokenize=False, enable_thinking=False)
    assert renderer.render(conversation(messages)).text == expected
    out = encoder.encode(conversation(messages), renderer)
    ids = out.ids.tolist()
    assert ids == tokenizer(expected, add_special_tokens=False)["input_ids"]
    assert ids == list(
        tokenizer.apply_chat_template(
            messages, tokenize=True, enable_thinking=False, return_dict=True
        )["input_ids"]
    )
    # Exactly each answer and its <|im_end|>, except that an answer starting with a newline
    # merges with the newline after "assistant" (a boundary token), as with chatml.
    runs = decoded_runs(backend, ids, out.mask.tolist())
    wanted = answers(messages)
    assert len(runs) == len(wanted)
    for run, answer in zip(runs, wanted):
        assert run == answer or run == "\n" + answer
    untrained = backend.decode(out.ids[out.mask == 0].tolist(), skip_special_tokens=False)
    assert "<think>" in untrained
