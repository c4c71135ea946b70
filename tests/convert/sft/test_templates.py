"""Chat templates: built-ins, the stock Llama 3 / Qwen3 templates, start-up refusals, the trained
-span rule (train_on_input, train_roles, per-message overrides), turns, pickling."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardtok.convert.sft.conversation import Conversation, Message
from shardtok.convert.sft.jinja_env import compile_template, render_tracked
from shardtok.convert.sft.templates import (
    BUILTINS,
    ChatTemplateRenderer,
    RenderRefused,
    load_template,
    template_tokens,
)
from shardtok.convert.tokenizing.tokenizer import BUNDLED_PATH, load_tokenizer
from shardtok.errors import UsageError

FIXTURES = Path(__file__).parent / "fixtures"
LLAMA3_STOCK = (FIXTURES / "llama3_chat_template.jinja").read_text()
QWEN3_STOCK = (FIXTURES / "qwen3_chat_template.jinja").read_text()
LLAMA3_TOKENS = {
    "special_tokens": {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                       "<|end_header_id|>", "<|eot_id|>"},
    "bos_token": "<|begin_of_text|>",
    "eos_token": "<|end_of_text|>",
}  # fmt: skip
QWEN3_TOKENS = {
    "special_tokens": {"<|endoftext|>", "<|im_start|>", "<|im_end|>"},
    "bos_token": None,
    "eos_token": "<|im_end|>",
}
BUNDLED_TOKENS = {
    "special_tokens": {"<|endoftext|>", "<|bos|>"},
    "bos_token": "<|bos|>",
    "eos_token": "<|endoftext|>",
}


def load(template, tokens=BUNDLED_TOKENS, tokenizer_path=None, **kwargs):
    return load_template(template, tokenizer_path=tokenizer_path, **tokens, **kwargs)


def conv(*pairs, train=None) -> Conversation:
    train = train or {}
    return Conversation(
        tuple(Message(role, content, train.get(i)) for i, (role, content) in enumerate(pairs))
    )


CHAT = conv(
    ("system", "Be brief."),
    ("user", "Hi there"),
    ("assistant", "Hello!"),
    ("user", "user"),
    ("assistant", "ok"),
)


def stock(source, messages, **variables):
    text, _ = render_tracked(compile_template(source), messages, **variables)
    return text


def dicts(conversation):
    return [{"role": m.role, "content": m.content} for m in conversation.messages]


def trained_text(rendered):
    return [rendered.text[a:b] for a, b in rendered.trained]


# -- built-ins ---------------------------------------------------------------------------------


def test_chatml_renders_like_qwen3_for_plain_messages():
    r = load("chatml", QWEN3_TOKENS)
    out = r.render(CHAT)
    assert out.text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nuser<|im_end|>\n"
        "<|im_start|>assistant\nok<|im_end|>\n"
    )
    assert trained_text(out) == ["Hello!<|im_end|>", "ok<|im_end|>"]
    # Qwen3's stock template renders the same, except that it gives the final assistant turn
    # (after the last user message) an empty <think></think> block: compare up to a user turn.
    upto_user = Conversation(CHAT.messages[:4])
    q = stock(QWEN3_STOCK, dicts(upto_user), add_generation_prompt=False, eos_token="<|im_end|>")
    assert r.render(upto_user).text == q


def test_llama3_renders_like_the_stock_template_without_its_trailing_header():
    r = load("llama3", LLAMA3_TOKENS)
    messy = conv(("system", " Be brief.\n"), ("user", "Hi"), ("assistant", "\n Hello! \n"))
    header = "<|start_header_id|>assistant<|end_header_id|>\n\n"
    for conversation in (CHAT, messy):
        ours = r.render(conversation)
        theirs = stock(LLAMA3_STOCK, dicts(conversation), bos_token="<|begin_of_text|>")
        assert theirs.endswith(header) and ours.text == theirs[: -len(header)]
    out = r.render(messy)
    assert trained_text(out) == ["Hello!<|eot_id|>"]  # the template trims, like the stock one
    assert [out.text[a:b] for a, b in out.content] == ["Be brief.", "Hi", "Hello!"]
    assert r.render_text(dicts(messy), add_generation_prompt=True)[0] == out.text + header


def test_alpaca_prompt():
    r = load("alpaca")
    out = r.render(conv(("user", "Add 2 and 3.\n\n2, 3"), ("assistant", "5")))
    assert out.text == (
        "<|bos|>Below is an instruction that describes a task. Write a response that "
        "appropriately completes the request.\n\n### Instruction:\nAdd 2 and 3.\n\n2, 3\n\n"
        "### Response:\n5<|endoftext|>"
    )
    assert trained_text(out) == ["5<|endoftext|>"]
    two = r.render(conv(("system", "Preamble."), ("user", "a"), ("assistant", "b"),
                        ("user", "c"), ("assistant", "d")))  # fmt: skip
    assert two.text == (
        "<|bos|>Preamble.\n\n### Instruction:\na\n\n### Response:\nb<|endoftext|>\n\n"
        "### Instruction:\nc\n\n### Response:\nd<|endoftext|>"
    )
    # GPT-2's BOS is its EOS: no BOS then.
    gpt2 = load("alpaca", {**BUNDLED_TOKENS, "bos_token": "<|endoftext|>"})
    assert gpt2.render(conv(("user", "a"), ("assistant", "b"))).text.startswith("Below")


def test_raw_is_contents_verbatim():
    r = load("raw")
    out = r.render(conv(("user", "2+2="), ("assistant", " 4")))
    assert out.text == "<|bos|>2+2= 4<|endoftext|>"
    assert trained_text(out) == [" 4<|endoftext|>"]
    assert out.turns == ((0, 11, False), (11, 26, True))


@pytest.mark.parametrize("name", BUILTINS)
def test_builtins_render_as_transformers_does(name):
    """Same text and generation spans as transformers' own renderer."""
    from transformers.utils.chat_template_utils import render_jinja_template

    tokens = {"chatml": QWEN3_TOKENS, "llama3": LLAMA3_TOKENS}.get(name, BUNDLED_TOKENS)
    r = load(name, tokens)
    variables = {k: v for k, v in tokens.items() if k != "special_tokens" and v}
    for prompt in (False, True):
        texts, spans = render_jinja_template(
            [dicts(CHAT)], chat_template=r.source, return_assistant_tokens_mask=True,
            add_generation_prompt=prompt, **variables,
        )  # fmt: skip
        assert r.render_text(dicts(CHAT), add_generation_prompt=prompt) == (texts[0], spans[0])


# -- refusals ----------------------------------------------------------------------------------


def tokenizer_folder(tmp_path, chat_template) -> Path:
    folder = tmp_path / "tok"
    folder.mkdir()
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"}
    if chat_template is not None:
        config["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(
    "source, tokens", [(LLAMA3_STOCK, LLAMA3_TOKENS), (QWEN3_STOCK, QWEN3_TOKENS)]
)
def test_stock_llama3_and_qwen3_templates_are_refused(tmp_path, source, tokens):
    folder = tokenizer_folder(tmp_path, source)
    with pytest.raises(UsageError, match="has no \\{% generation %\\} block") as err:
        load("tokenizer", tokens, tokenizer_path=str(folder))
    message = str(err.value)
    assert str(folder) in message and "chatml / llama3 / alpaca / raw" in message
    assert "\n" not in message
    path = tmp_path / "stock.jinja"
    path.write_text(source)
    with pytest.raises(UsageError, match="has no \\{% generation %\\} block"):
        load(str(path), tokens)


def test_a_trailing_generation_prompt_is_refused(tmp_path):
    """Llama 3's stock template with generation blocks still appends the assistant header."""
    path = tmp_path / "t.jinja"
    path.write_text(
        LLAMA3_STOCK.replace("{{ content }}", "{% generation %}{{ content }}{% endgeneration %}")
    )
    with pytest.raises(UsageError, match="after the last message even when no generation prompt"):
        load(str(path), LLAMA3_TOKENS)


def test_builtin_special_tokens_must_be_the_tokenizers(tmp_path):
    with pytest.raises(UsageError, match="needs <\\|im_start\\|>, <\\|im_end\\|> as special"):
        load("chatml")
    with pytest.raises(UsageError, match="<\\|start_header_id\\|>"):
        load("llama3", QWEN3_TOKENS)
    with pytest.raises(UsageError, match="has none: name one with --eos-token"):
        load("raw", {**BUNDLED_TOKENS, "eos_token": None})


def test_no_chat_template_in_the_tokenizer(tmp_path):
    for path in (BUNDLED_PATH, tokenizer_folder(tmp_path, None), None):
        with pytest.raises(UsageError, match="has no chat template: give --chat-template chatml"):
            load("tokenizer", tokenizer_path=None if path is None else str(path))
    with pytest.raises(UsageError, match="neither a built-in"):
        load(str(tmp_path / "missing.jinja"))


GOOD = (
    "{% for m in messages %}{% if m.role == 'assistant' %}A: {% generation %}{{ m.content }}"
    "{{ eos_token }}{% endgeneration %}\n{% else %}U: {{ m.content }}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}A: {% endif %}"
)


def test_tokenizer_template_forms(tmp_path):
    """A string, named templates ("default"), and chat_template.jinja, which wins."""
    folder = tokenizer_folder(tmp_path, [{"name": "tool_use", "template": "x"},
                                         {"name": "default", "template": GOOD}])  # fmt: skip
    r = load("tokenizer", tokenizer_path=str(folder))
    assert r.source == GOOD and r.name == "tokenizer"
    assert load("tokenizer", tokenizer_path=str(folder / "tokenizer.json")).source == GOOD
    (folder / "chat_template.jinja").write_text(GOOD.replace("U: ", "User: "))
    assert "User: " in load("tokenizer", tokenizer_path=str(folder)).source


@pytest.mark.parametrize(
    "source, match",
    [
        ("{% for m in messages %}{{ m.content }}{% endfor %}", "no \\{% generation %\\} block"),
        ("{% generation %}{% endgeneration %}{% for m in messages %}{{ m.content }}{% endfor %}"
         "{% if add_generation_prompt %}A:{% endif %}", "not around the assistant's content"),
        ("{% generation %}{{ messages[0].content", "does not compile"),
        # Inside a macro, a block's position is wrong (transformers' too): it must be refused.
        ("{% macro all() %}" + GOOD.split("{% if add_generation_prompt %}")[0] + "{% endmacro %}"
         "{{ all() }}{% if add_generation_prompt %}A: {% endif %}", "not around the assistant's"),
        ("{% generation %}{% endgeneration %}{{ raise_exception('no') }}", "fails on a plain"),
        # Qwen3's way: the last assistant turn is rendered differently from the earlier ones.
        (GOOD.replace("A: ", "A: {% if loop.last %}(last) {% endif %}", 1),
         "renders messages 0-2 differently once message 3 follows"),
    ],
)  # fmt: skip
def test_templates_that_cannot_give_masks_are_refused(tmp_path, source, match):
    path = tmp_path / "t.jinja"
    path.write_text(source)
    with pytest.raises(UsageError, match=match):
        load(str(path))


def test_a_template_refusing_a_record_is_a_render_refusal(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text(
        GOOD.replace(
            "{% for m in messages %}",
            "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools') }}"
            "{% endif %}",
        )
    )
    with pytest.raises(RenderRefused, match="no tools"):
        load(str(path)).render(conv(("user", "a"), ("tool", "b")))


# -- which characters are trained --------------------------------------------------------------


def test_default_trains_the_generation_blocks_of_assistants():
    out = load("chatml", QWEN3_TOKENS).render(CHAT)
    assert trained_text(out) == ["Hello!<|im_end|>", "ok<|im_end|>"]
    assert [t[2] for t in out.turns] == [False, False, True, False, True]
    assert [out.text[a:b] for a, b in out.content] == [
        "Be brief.", "Hi there", "Hello!", "user", "ok"
    ]  # fmt: skip
    # Turns cover the text, in order.
    assert out.turns[0][0] == 0 and out.turns[-1][1] == len(out.text)
    assert all(a[1] == b[0] for a, b in zip(out.turns, out.turns[1:]))


def test_train_on_input_trains_every_character():
    out = load("chatml", QWEN3_TOKENS, train_on_input=True).render(CHAT)
    assert out.trained == ((0, len(out.text)),)


def test_train_roles_train_whole_turns():
    out = load("chatml", QWEN3_TOKENS, train_roles=("assistant", "user")).render(CHAT)
    assert trained_text(out) == [
        "<|im_start|>user\nHi there<|im_end|>\n", "Hello!<|im_end|>",
        "<|im_start|>user\nuser<|im_end|>\n", "ok<|im_end|>",
    ]  # fmt: skip


def test_per_message_overrides():
    r = load("chatml", QWEN3_TOKENS)
    out = r.render(Conversation(tuple(
        Message(m.role, m.content, {1: True, 2: False}.get(i)) for i, m in enumerate(CHAT.messages)
    )))  # fmt: skip
    assert trained_text(out) == ["<|im_start|>user\nHi there<|im_end|>\n", "ok<|im_end|>"]
    # With train_on_input, an override false still untrains its turn.
    r = load("chatml", QWEN3_TOKENS, train_on_input=True)
    out = r.render(conv(*[(m.role, m.content) for m in CHAT.messages], train={2: False}))
    assert [out.text[a:b] for a, b in out.trained] == [
        out.text[: out.turns[2][0]], out.text[out.turns[3][0] :]
    ]  # fmt: skip


def test_content_is_located_after_its_header():
    """Content "user" is also in its header "<|im_start|>user": the content is the later one."""
    out = load("chatml", QWEN3_TOKENS).render(conv(("user", "user"), ("assistant", "im_end")))
    assert [out.text[a:b] for a, b in out.content] == ["user", "im_end"]
    assert out.content[0][0] == len("<|im_start|>user\n")
    assert out.content[1][0] == out.text.rindex("\nim_end<|im_end|>") + 1


# -- the renderer as an object -----------------------------------------------------------------


def test_the_renderer_pickles_as_source_and_settings():
    r = load("alpaca", train_roles=("assistant", "user"))
    before = r.render(CHAT)
    blob = pickle.dumps(r)
    assert b"jinja2" not in blob  # no compiled template in it
    again = pickle.loads(blob)
    assert isinstance(again, ChatTemplateRenderer) and again.render(CHAT) == before
    assert pickle.loads(pickle.dumps(again)).render(CHAT) == before


def test_template_tokens_of_a_spec():
    spec = load_tokenizer("bundled", append_eos=False)
    assert template_tokens(spec) == {
        "special_tokens": frozenset({"<|endoftext|>", "<|bos|>"}),
        "bos_token": "<|bos|>",
        "eos_token": "<|endoftext|>",
    }


def test_importing_templates_does_not_import_transformers():
    code = (
        "import sys, shardtok.convert.sft.templates, shardtok.convert.sft.encode\n"
        "assert 'transformers' not in sys.modules, 'transformers imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[3])


# -- turn boundaries: the template's loop, or every prefix --------------------------------------

ROLES = st.sampled_from(["system", "user", "assistant"])
CONTENT = st.lists(st.sampled_from(["a", " ", "\n", "user", "Hi", "é", "<", "|"]), max_size=6)


def prefix_turns(r, conversation):
    msgs = dicts(conversation)
    text, _ = r.render_text(msgs)
    return r.turn_bounds(msgs, text)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(ROLES, CONTENT.map("".join)), min_size=1, max_size=7),
       st.sampled_from(BUILTINS))  # fmt: skip
def test_loop_turns_are_the_prefix_turns(pairs, name):
    """The built-ins take the fast path; its turns are what rendering every prefix gives."""
    tokens = {"chatml": QWEN3_TOKENS, "llama3": LLAMA3_TOKENS}.get(name, BUNDLED_TOKENS)
    r = load(name, tokens)
    conversation = conv(*pairs)
    out = r.render(conversation)
    assert r._loop_bounds is True
    bounds = prefix_turns(r, conversation)
    assert [(a, b) for a, b, _ in out.turns] == list(zip(bounds, bounds[1:]))


@pytest.mark.parametrize(
    "source",
    [
        # Peeks ahead with loop.last (the next message is taken before this turn is output).
        GOOD.replace("{% endif %}{% endfor %}", "{% endif %}{% if loop.last %}{% endif %}{% endfor %}"),
        # Loops over a copy (a slice is a plain list): no loop positions.
        GOOD.replace("in messages", "in messages[0:]"),
    ],
)  # fmt: skip
def test_templates_whose_loop_cannot_tell_turns_render_every_prefix(tmp_path, source):
    path = tmp_path / "t.jinja"
    path.write_text(source)
    r = load(str(path))
    out = r.render(CHAT)
    assert r._loop_bounds is False
    bounds = prefix_turns(r, CHAT)
    assert [(a, b) for a, b, _ in out.turns] == list(zip(bounds, bounds[1:]))
    assert trained_text(out) == ["Hello!<|endoftext|>", "ok<|endoftext|>"]


def test_a_record_whose_loop_turns_fail_the_check_renders_every_prefix(tmp_path):
    """A tool message's closing tag comes out when the next message is taken (or after the
    loop): the loop position would give it to the next turn. The check of the last boundary
    catches that, and every prefix is rendered."""
    path = tmp_path / "t.jinja"
    path.write_text(
        "{% for m in messages %}{% if loop.previtem and loop.previtem.role == 'tool' %}</tool>"
        "{% endif %}{% if m.role == 'tool' %}<tool>{{ m.content }}"
        "{% elif m.role == 'assistant' %}A: {% generation %}{{ m.content }}{{ eos_token }}"
        "{% endgeneration %}\n{% else %}U: {{ m.content }}\n{% endif %}{% endfor %}"
        "{% if messages[-1].role == 'tool' %}</tool>{% endif %}"
        "{% if add_generation_prompt %}A: {% endif %}"
    )
    r = load(str(path))
    conversation = conv(("user", "q"), ("assistant", "call"), ("tool", "42"), ("user", "so?"))
    out = r.render(conversation)
    assert r._loop_bounds is True  # the probes have no tool message
    assert out.text[out.turns[2][0] : out.turns[2][1]] == "<tool>42</tool>"
    bounds = prefix_turns(r, conversation)
    assert [(a, b) for a, b, _ in out.turns] == list(zip(bounds, bounds[1:]))


# -- the trailing-header refusal names what it refuses ---------------------------------------------

# The issue's hand-written template: user turns end in "\n", no add_generation_prompt branch.
ISSUE_TEMPLATE = (
    "{% for m in messages %}{% if m.role == 'assistant' %}### Assistant:\n{% generation %}"
    "{{ m.content }}<|endoftext|>{% endgeneration %}{{ '\\n' }}"
    "{% else %}### {{ m.role }}:\n{{ m.content }}\n{% endif %}{% endfor %}"
)
VICUNA_TEMPLATE = (
    "{% for m in messages %}{% if m.role == 'system' %}{{ m.content + ' ' }}"
    "{% elif m.role == 'user' %}{{ 'USER: ' + m.content + ' ' }}"
    "{% else %}{{ 'ASSISTANT: ' }}{% generation %}{{ m.content + eos_token }}{% endgeneration %}"
    "{% endif %}{% endfor %}"
)
# No assistant header at all: the user's end-of-turn token is the user's own, not a header.
END_MARKED_TEMPLATE = (
    "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}"
    "{{ eos_token }}{% endgeneration %}{% else %}{{ m.content }}<|bos|>{% endif %}{% endfor %}"
)


@pytest.mark.parametrize(
    "source, trained",
    [
        (ISSUE_TEMPLATE, ["Hello!<|endoftext|>", "ok<|endoftext|>"]),
        (VICUNA_TEMPLATE, ["Hello!<|endoftext|>", "ok<|endoftext|>"]),
        (END_MARKED_TEMPLATE, ["Hello!<|endoftext|>", "ok<|endoftext|>"]),
    ],
)
def test_hand_written_templates_without_a_generation_prompt_are_accepted(tmp_path, source, trained):
    path = tmp_path / "t.jinja"
    path.write_text(source)
    r = load(str(path))
    out = r.render(CHAT)
    assert out.text == stock(source, dicts(CHAT), eos_token="<|endoftext|>")
    assert trained_text(out) == trained
    bounds = prefix_turns(r, CHAT)
    assert [(a, b) for a, b, _ in out.turns] == list(zip(bounds, bounds[1:]))


def test_the_issue_template_masks_through_the_encoder(tmp_path):
    from shardtok.convert.sft.encode import SFTEncoder

    path = tmp_path / "t.jinja"
    path.write_text(ISSUE_TEMPLATE)
    spec = load_tokenizer("bundled", append_eos=False)
    r = load_template(str(path), tokenizer_path=None, **template_tokens(spec))
    out = SFTEncoder(spec, max_tokens=None).encode(CHAT, r)
    backend = spec_backend(spec)
    trained = backend.decode(out.ids[out.mask == 1].tolist(), skip_special_tokens=False)
    assert trained.replace(" ", "") == "Hello!<|endoftext|>ok<|endoftext|>".replace(" ", "")
    assert out.mask[-1] == 0  # the "\n" after the last answer is not trained


def spec_backend(spec):
    from tokenizers import Tokenizer

    return Tokenizer.from_str(spec.backend_json)


@pytest.mark.parametrize(
    "source",
    [
        # The header after the loop, unconditional, and in the assistant's own iteration.
        GOOD.replace("{% if add_generation_prompt %}A: {% endif %}", "A: "),
        # The same, written by the user's iteration peeking ahead (loop positions untrusted).
        "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}"
        "{{ eos_token }}{% endgeneration %}\n{% else %}U: {{ m.content }}\nA:"
        "{% if loop.last %}{% endif %}{% endif %}{% endfor %}",
    ],
)
def test_an_unconditional_assistant_header_is_refused(tmp_path, source):
    path = tmp_path / "t.jinja"
    path.write_text(source)
    with pytest.raises(UsageError, match="after the last message even when no generation prompt"):
        load(str(path))
