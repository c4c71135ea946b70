"""The built-ins' Python twins (render.python_renderer) give exactly what their Jinja gives, in
the plain environment and in the sandbox: text, generation spans and the loop's positions; the
renderer uses a twin only for the built-in's own source."""

from __future__ import annotations

from importlib import resources

from hypothesis import given, settings
from hypothesis import strategies as st

from shardtok.convert.sft.conversation import Conversation, Message
from shardtok.convert.sft.jinja_env import (
    AttrMessage,
    TrackedMessages,
    compile_builtin,
    compile_template,
    render_tracked,
)
from shardtok.convert.sft.render import ChatTemplateRenderer, python_renderer

TWINS = ("llama3",)
WHITESPACE = [" ", "\n", "\t", "\r", "\u00a0", "\u2003", "\x1c", "\u3000", "\x85"]
text = st.lists(
    st.one_of(st.sampled_from([*WHITESPACE, "<|eot_id|>", "é", "🙂", "x"]), st.text(max_size=5)),
    max_size=6,
).map("".join)
role = st.one_of(st.sampled_from(["system", "user", "assistant", "tool"]), text)
messages = st.lists(st.fixed_dictionaries({"role": role, "content": text}), max_size=6)


def _source(name: str) -> str:
    asset = resources.files("shardtok") / "assets" / "chat_templates" / f"{name}.jinja"
    return asset.read_text(encoding="utf-8")


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(TWINS), conversation=messages)
def test_twins_render_as_their_jinja(name, conversation):
    source = _source(name)
    twin = python_renderer(name, source)
    assert twin is not None
    got = TrackedMessages(AttrMessage(m) for m in conversation)
    text_, spans = twin(got)
    for template, kind in (
        (compile_builtin(source), AttrMessage),
        (compile_template(source), dict),
    ):
        want = TrackedMessages(kind(m) for m in conversation)
        assert (text_, spans) == render_tracked(template, want)
        assert got.positions == want.positions
    # A plain list (a prefix render) has no positions to record and renders the same.
    assert twin([dict(m) for m in conversation]) == (text_, spans)


@settings(max_examples=100, deadline=None)
@given(conversation=messages)
def test_rendered_records_are_the_same_without_the_twin(conversation):
    renderer = ChatTemplateRenderer(
        "llama3", _source("llama3"), variables={}, turns="stable", builtin=True
    )
    jinja_only = ChatTemplateRenderer(
        "llama3", _source("llama3"), variables={}, turns="stable", builtin=True
    )
    jinja_only._python = False
    record = Conversation(tuple(Message(m["role"], m["content"]) for m in conversation))
    results = []
    for one in (renderer, jinja_only):
        try:
            results.append(one.render(record))
        except Exception as exc:  # the same refusal either way
            results.append((type(exc), str(exc)))
    assert results[0] == results[1]
    assert renderer._python is not False or not conversation


def test_a_changed_source_gets_no_twin():
    source = _source("llama3")
    assert python_renderer("llama3", source + "\n") is None
    assert python_renderer("chatml", _source("chatml")) is None
