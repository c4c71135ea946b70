"""Chat templates: which one, and whether it can give correct masks.

A template is ``tokenizer`` (the chat template of the tokenizer folder), a Jinja file, or a
built-in (``shardtok/assets/chat_templates/``): ``chatml``, ``llama3``, ``alpaca``, ``raw``,
``qwen3``.
Every template must mark what the model generates with ``{% generation %}`` blocks, which
transformers' ``apply_chat_template(..., return_assistant_tokens_mask=True)`` reads the same
way; the built-ins put each assistant's content *and* its end-of-turn token in the block, so
the model learns to stop. What is trained from there is :mod:`shardtok.convert.sft.render`'s
rule (generation spans of trained messages; whole turns with ``train_on_input``).

Refused at start-up, with a sentence saying what to do: a template with no generation block
(the stock Llama 3 and Qwen3 templates), one that renders the assistant's header after the last
message when no generation prompt is asked for (stock Llama 3 does; a user turn's own ending,
such as Alpaca's "\\n", passes: see _trailing_header), one whose
turns change once more messages follow, and a built-in whose special tokens the tokenizer
lacks.

Importing this module imports jinja2, never transformers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from importlib import resources
from pathlib import Path

from shardtok.convert.sft.jinja_env import TrackedMessages, budget_message
from shardtok.convert.sft.render import (
    PEEKS,
    PROBE,
    ChatTemplateRenderer,
    RenderRefused,
)
from shardtok.errors import UsageError

__all__ = [
    "BUILTINS",
    "LOOP_BUILTINS",
    "ChatTemplateRenderer",
    "RenderRefused",
    "load_template",
    "template_tokens",
]

# The prefix-stable built-ins, written so that each loop iteration outputs exactly its message's
# turn (render.py's "stable"), and qwen3, which is not prefix-stable (Qwen3's own rendering gives
# the last answer an empty think block) and takes its turns from its loop ("loop").
BUILTINS = ("chatml", "llama3", "alpaca", "raw")
LOOP_BUILTINS = ("qwen3",)
# What the built-ins write literally: the tokenizer must have them as special tokens, else they
# would be encoded as ordinary text and the model would never see a control token.
BUILTIN_SPECIALS = {
    "chatml": ("<|im_start|>", "<|im_end|>"),
    "qwen3": ("<|im_start|>", "<|im_end|>"),
    "llama3": ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
}
_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")  # transformers' own test
_ALTERNATIVES = "chatml / llama3 / alpaca / raw / qwen3"


def template_tokens(spec) -> dict:
    """``special_tokens``, ``bos_token`` and ``eos_token`` of a TokenizerSpec, as
    :func:`load_template` takes them: ``load_template(name, ..., **template_tokens(spec))``."""
    from shardtok.convert.tokenizing.tokenizer import _LOADED_BACKENDS

    backend = _LOADED_BACKENDS.get(spec.fingerprint)
    if backend is None:
        from tokenizers import Tokenizer

        backend = Tokenizer.from_str(spec.backend_json)
    specials = {t.content for t in backend.get_added_tokens_decoder().values() if t.special}

    def token(token_id):
        return None if token_id is None else backend.id_to_token(token_id)

    return {
        "special_tokens": frozenset(specials),
        "bos_token": token(spec.bos_id),
        "eos_token": token(spec.eos_id),
    }


def load_template(
    template: str,
    *,
    tokenizer_path: str | None,
    special_tokens: Collection[str],
    bos_token: str | None,
    eos_token: str | None,
    train_on_input: bool = False,
    train_roles: tuple[str, ...] = ("assistant",),
) -> ChatTemplateRenderer:
    """The renderer for `template` (a built-in name, ``tokenizer``, or a Jinja file), checked.

    `special_tokens`: the tokenizer's special added-token strings; `bos_token`/`eos_token`: its
    BOS/EOS strings, given to the template as transformers does. UsageError, in one sentence
    saying what to do, for a template that cannot give correct masks."""
    if special_tokens is None:
        raise ValueError("load_template needs the special tokens: pass **template_tokens(spec)")
    variables = {k: v for k, v in (("bos_token", bos_token), ("eos_token", eos_token)) if v}
    turns = "checked"
    if template in BUILTINS or template in LOOP_BUILTINS:
        turns = "loop" if template in LOOP_BUILTINS else "stable"
        name, source = template, _builtin_source(template, special_tokens, eos_token)
    elif template == "tokenizer":
        name, source, extra = "tokenizer", *_tokenizer_template(tokenizer_path)
        variables = {**extra, **variables}
    else:
        path = Path(template)
        if not path.is_file():
            raise UsageError(
                f"chat template {template!r} is neither a built-in ({_ALTERNATIVES}), "
                "'tokenizer' nor a Jinja file: give one of those"
            )
        name, source = str(path), path.read_text(encoding="utf-8")
    renderer = ChatTemplateRenderer(
        name, source, variables=variables, special_tokens=special_tokens,
        train_on_input=train_on_input, train_roles=train_roles, turns=turns,
        builtin=turns != "checked",
    )  # fmt: skip
    _check(renderer, tokenizer_path)
    return renderer


def _builtin_source(name: str, special_tokens: Collection[str], eos_token: str | None) -> str:
    missing = [t for t in BUILTIN_SPECIALS.get(name, ()) if t not in special_tokens]
    if missing:
        raise UsageError(
            f"chat template {name!r} needs {', '.join(missing)} as special tokens of the "
            "tokenizer, which it lacks: use a template written for this tokenizer "
            "('tokenizer', a Jinja file, or alpaca / raw)"
        )
    if name in ("alpaca", "raw") and not eos_token:
        raise UsageError(
            f"chat template {name!r} ends each response with the EOS token, and the tokenizer "
            "has none: name one with --eos-token"
        )
    return (resources.files("shardtok") / "assets" / "chat_templates" / f"{name}.jinja").read_text(
        encoding="utf-8"
    )


def _tokenizer_template(tokenizer_path: str | None) -> tuple[str, dict]:
    """The chat template of a tokenizer folder (chat_template.jinja, or tokenizer_config.json's
    ``chat_template``: a string or named templates, of which "default"), and the special-token
    strings its config names (transformers gives them to the template too)."""
    folder = Path(tokenizer_path) if tokenizer_path else None
    if folder is not None and not folder.is_dir():
        folder = folder.parent  # a tokenizer.json: its folder
    config: dict = {}
    if folder is not None and (folder / "tokenizer_config.json").is_file():
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    extra = {}
    for key in ("unk_token", "pad_token", "sep_token", "cls_token", "mask_token"):
        value = config.get(key)
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            extra[key] = value
    source = config.get("chat_template")
    if isinstance(source, list):
        source = next((t.get("template") for t in source if t.get("name") == "default"), None)
    if folder is not None and (folder / "chat_template.jinja").is_file():
        source = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    if not isinstance(source, str) or not source:
        raise UsageError(
            f"the tokenizer {tokenizer_path} has no chat template: give --chat-template "
            f"{_ALTERNATIVES} or a Jinja file"
        )
    return source, extra


def _check(renderer: ChatTemplateRenderer, tokenizer_path: str | None) -> None:
    """Refuse, at start-up, a template that would give wrong or empty masks."""
    if renderer.name == "tokenizer":
        label = f"the chat template of tokenizer {tokenizer_path}"
    else:
        label = f"chat template {renderer.name!r}"
    if not _GENERATION_TAG.search(renderer.source):
        raise UsageError(
            f"{label} has no {{% generation %}} block, so no token would be "
            "trained: add {% generation %}...{% endgeneration %} around each assistant "
            "message's content and end-of-turn token, or use a built-in: "
            f"--chat-template {_ALTERNATIVES}"
        )
    try:
        renderer._template()
    except Exception as exc:
        raise UsageError(f"{label} does not compile: {exc}") from None
    user, assistant = PROBE[1:3]
    try:
        plain, _ = renderer.render_text([user])
        tracked = TrackedMessages([dict(user), dict(assistant)])
        pair, spans = renderer.render_text(tracked)
    except Exception as exc:
        over = budget_message(exc)
        if over is not None:
            raise UsageError(
                f"{label}, {over} (on a plain user/assistant conversation): a template must "
                "render a conversation within that budget"
            ) from None
        raise UsageError(f"{label} fails on a plain user/assistant conversation: {exc}") from None
    header = _trailing_header(renderer, plain, pair, tracked.positions, user, assistant)
    if header:
        raise UsageError(
            f"{label} renders {header!r} after the last message even when no "
            "generation prompt is asked for, and that is the assistant's header (the text "
            "between a user message and the assistant's content), so every conversation would "
            "end with it, as with the stock Llama 3 template: put it under "
            "{% if add_generation_prompt %}, or use --chat-template llama3"
        )
    if not any(assistant["content"] in pair[a:b] for a, b in spans):
        raise UsageError(
            f"{label} has {{% generation %}} blocks, but not around the assistant's content "
            "(inside a macro or a set block their positions are lost): put a block around each "
            "assistant message's content, outside macros and set blocks"
        )
    if renderer.turns == "loop":
        if not renderer.probe_turns():
            raise UsageError(f"{label} cannot be used: its loop does not take each message once")
        return
    for probe in (list(PROBE), list(PROBE[1:])):
        try:
            text, _ = renderer.render_text(probe)
        except Exception:
            continue  # a template may refuse system messages: try without
        try:
            renderer.turn_bounds(probe, text)
        except RenderRefused as exc:
            raise UsageError(
                f"{label} cannot be used: {exc.detail} (it must render each "
                "message the same whatever follows it)"
            ) from None
        break
    renderer.probe_turns()


def _trailing_header(renderer, plain: str, pair: str, positions, user, assistant) -> str:
    """What [user] renders after the user's content that is the assistant's header, or "".

    T, what [user] renders after the user's content, is refused when it is the text that
    [user, assistant] renders between the user's and the assistant's content (B) give or take
    trailing whitespace, less what the user's own turn ends with (its end-of-turn token, a
    newline): the loop position of the assistant tells that apart where the template's loop
    takes messages one at a time (else all of T counts). So ``### user:\\n...\\n`` followed by
    ``### Assistant:\\n`` passes (T is "\\n", B "\\n### Assistant:\\n"), and stock Llama 3,
    whose T is ``<|eot_id|>`` and the assistant header, is refused."""
    start = plain.rfind(user["content"])
    in_pair = pair.find(user["content"])
    answer = pair.find(assistant["content"], in_pair + 1)
    if start < 0 or in_pair < 0 or answer < 0:
        return ""  # the template rewrites the contents: nothing to compare
    user_end = in_pair + len(user["content"])
    trailing, between = plain[start + len(user["content"]) :], pair[user_end:answer]
    if not between.startswith(trailing) or between[len(trailing) :].strip():
        return ""  # the assistant's header is more than what the user's turn leaves behind
    own = ""  # what the user's turn itself ends with
    if len(positions) == 2 and not PEEKS.search(renderer.source):
        turn = positions[1]
        if user_end <= turn <= answer:
            own = pair[user_end:turn]
    extra = trailing[len(own) :] if trailing.startswith(own) else trailing
    return trailing if extra.strip() else ""
