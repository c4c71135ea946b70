"""The chat-template renderer: a Conversation to one string, its trained spans and turns.

Which characters are trained:

- A message is trained if its ``train`` override says so, else if ``train_on_input``, else if
  its role is in ``train_roles`` (default ``("assistant",)``).
- With ``train_on_input`` a trained message trains its whole turn (header, content, end of
  turn), so with no override every rendered character is trained.
- Otherwise a trained message trains exactly the ``{% generation %}`` spans inside its turn (for
  an assistant: what transformers' ``return_assistant_tokens_mask`` marks), or its whole turn
  when it has none (a ``user`` listed in ``train_roles``).
- An untrained message trains nothing, generation blocks included (``train: false``).

A message's turn is what ``messages[:i+1]`` renders beyond ``messages[:i]`` (turn 0 starts
at 0, so a BOS belongs to it). A template for which that is not a prefix (it changes earlier
turns once more follow) is refused at start-up when the probe conversations show it, else per
record (a bad ``invalid_conversation``). Rendering every prefix costs O(n²) for n messages, so
where the template's own loop shows where each message starts (TrackedMessages: a top-level
``for`` over ``messages`` that never peeks ahead with ``loop.last``/``loop.nextitem``), and the
probe conversations confirm it gives the prefix boundaries, a record is rendered twice: once
whole, once without its last message (the check that the boundaries hold for it, and the prefix
``truncation: turns`` would keep); otherwise every prefix is rendered.

``turns`` says how far a template's loop is trusted: ``checked`` (any template a user brings:
the above), ``stable`` (a built-in whose every iteration writes exactly its own message's turn,
and nothing after the loop depends on the messages, so the probes' agreement holds for every
record: one render per record) and ``loop`` (a built-in that is not prefix-stable by design,
like Qwen3's, whose last answer gets an empty think block: its turns are where its loop takes
each message, and no prefix is compared).

The Jinja environment is built lazily in each process, so a renderer pickles as its source and
settings (spawned workers get it that way).
"""

from __future__ import annotations

import re
from collections.abc import Collection

from shardtok.convert.sft.conversation import Conversation, Message, Rendered, merge_spans
from shardtok.convert.sft.jinja_env import (
    AttrMessage,
    TrackedMessages,
    budget_message,
    compile_builtin,
    compile_template,
    render_tracked,
)

# Loop attributes that take the next message before the current one's turn is output.
PEEKS = re.compile(r"\bloop\s*(\.\s*|\[\s*['\"])(last|nextitem)\b")
TURNS = ("checked", "stable", "loop")
# A conversation within these renders a built-in template far inside every budget of
# jinja_env (each built-in takes a bounded number of steps and characters per message, and its
# values are at most twice the contents), so the plain environment gives what the sandbox
# gives; a larger one is rendered in the sandbox, whose budget may refuse it.
BUILTIN_LIMITS = (4096, 1 << 20)  # messages, characters of roles and contents
# Probe contents: distinct, no whitespace (templates that trim keep them whole).
PROBE = (
    {"role": "system", "content": "ProbeSystem"},
    {"role": "user", "content": "ProbeUser1"},
    {"role": "assistant", "content": "ProbeAssistant1"},
    {"role": "user", "content": "ProbeUser2"},
    {"role": "assistant", "content": "ProbeAssistant2"},
)


class RenderRefused(Exception):
    """The template cannot render this conversation (it raised, or it breaks the turn prefixes).

    The encoder turns it into a bad record ``invalid_conversation`` with ``detail``."""

    def __init__(self, detail: str):
        super().__init__(detail)
        self.detail = detail


class ChatTemplateRenderer:
    """Renders Conversations with one Jinja chat template (picklable: source and settings)."""

    def __init__(
        self,
        name: str,
        source: str,
        *,
        variables: dict[str, str],
        special_tokens: Collection[str] = (),
        train_on_input: bool = False,
        train_roles: tuple[str, ...] = ("assistant",),
        turns: str = "checked",
        builtin: bool = False,
    ):
        if turns not in TURNS:
            raise ValueError(f"turns must be one of {', '.join(TURNS)}, not {turns!r}")
        self.name = name
        self.turns = turns
        self.source = source
        self.variables = dict(variables)  # bos_token, eos_token...: what transformers passes
        self.special_tokens = tuple(sorted(special_tokens, key=lambda t: (-len(t), t)))
        self.train_on_input = bool(train_on_input)
        self.train_roles = tuple(train_roles)
        # shardtok's own template (assets/chat_templates): rendered outside the sandbox
        # (jinja_env.compile_builtin) where BUILTIN_LIMITS allow.
        self.builtin = bool(builtin)
        self._compiled = None
        self._plain = None
        # The built-in's Python twin (python_renderer), found when first rendering; False: none.
        self._python = None
        self._loop_bounds: bool | None = None  # whether the fast boundaries hold (probed once)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_compiled"] = state["_plain"] = state["_python"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)

    def _template(self, sandboxed: bool = True):
        if self.builtin and not sandboxed:
            if self._plain is None:
                self._plain = compile_builtin(self.source)
            return self._plain
        if self._compiled is None:
            self._compiled = compile_template(self.source)
        return self._compiled

    def _sandboxed(self, messages) -> bool:
        if not self.builtin:
            return True
        most, chars = BUILTIN_LIMITS
        # list.__iter__: iterating a TrackedMessages would record loop positions.
        return (
            len(messages) > most
            or sum(len(m["role"]) + len(m["content"]) for m in list.__iter__(messages)) > chars
        )

    def render_text(self, messages: list[dict], add_generation_prompt: bool = False):
        """(text, generation spans) exactly as transformers renders ``messages``."""
        sandboxed = self._sandboxed(messages)
        if not sandboxed and not add_generation_prompt and self._python is not False:
            if self._python is None:
                self._python = python_renderer(self.name, self.source) or False
            if self._python is not False:
                return self._python(messages)
        return render_tracked(
            self._template(sandboxed), messages,
            add_generation_prompt=add_generation_prompt, **self.variables,
        )  # fmt: skip

    def _render_or_refuse(self, messages: list[dict]):
        try:
            return self.render_text(messages)
        except Exception as exc:  # raise_exception, undefined names, type errors in the template
            why = budget_message(exc) or exc
            raise RenderRefused(f"the chat template cannot render it: {why}") from None

    def turn_bounds(self, messages: list[dict], text: str) -> list[int]:
        """Character offsets where each message's turn starts in `text`, plus len(text), from
        a render of every prefix (RenderRefused if one is not a prefix of `text`)."""
        bounds = [0]
        for i in range(1, len(messages)):
            prefix, _ = self._render_or_refuse(messages[:i])
            if not text.startswith(prefix) or len(prefix) < bounds[-1]:
                raise RenderRefused(
                    f"the chat template renders messages 0-{i - 1} differently once message "
                    f"{i} follows, so the turns cannot be told apart"
                )
            bounds.append(len(prefix))
        bounds.append(len(text))
        return bounds

    def probe_turns(self) -> bool:
        """Whether turns come from the template's loop (decided once, on the probe
        conversations; done at start-up so that the workers get the answer pickled)."""
        if self._loop_bounds is None:
            self._loop_bounds = self._probe_loop_bounds()
        return self._loop_bounds

    def _loop_turn_bounds(self, msgs: TrackedMessages, text: str) -> list[int] | None:
        """The turn bounds where the template's loop took each message, if they can be
        trusted (see the module docstring), else None."""
        self.probe_turns()
        n, positions = len(msgs), msgs.positions
        if not self._loop_bounds or len(positions) != n:
            return None
        bounds = [0, *positions[1:], len(text)]
        if any(a > b for a, b in zip(bounds, bounds[1:])):
            return None
        if n > 1 and self.turns == "checked":
            prefix, _ = self._render_or_refuse(msgs[:-1])
            if len(prefix) != bounds[-2] or not text.startswith(prefix):
                return None
        return bounds

    def _probe_loop_bounds(self) -> bool:
        if PEEKS.search(self.source) and self.turns != "loop":
            return False
        rendered = 0
        for n in range(1, len(PROBE) + 1):
            for probe in (PROBE[:n], PROBE[1 : n + 1]):
                msgs = TrackedMessages(dict(m) for m in probe)
                try:
                    text, _ = self.render_text(msgs)
                except Exception:
                    continue  # a template may refuse system messages, or a lone one
                found = [0, *msgs.positions[1:], len(text)]
                if len(msgs.positions) != len(probe):
                    return False
                if self.turns == "loop":
                    expected = sorted(found)  # no prefix to agree with: in order is all
                else:
                    try:
                        expected = self.turn_bounds(msgs[:], text)
                    except RenderRefused:
                        return False
                if found != expected:
                    return False
                rendered += 1
        return rendered > 0

    def trained(self, message: Message) -> bool:
        if message.train is not None:
            return message.train
        return self.train_on_input or message.role in self.train_roles

    def render(self, conversation: Conversation) -> Rendered:
        # AttrMessage only matters to the plain environment (and is a dict to the sandbox).
        kind = AttrMessage if self.builtin else dict
        msgs = TrackedMessages(kind(role=m.role, content=m.content) for m in conversation.messages)
        text, generation = self._render_or_refuse(msgs)
        bounds = self._loop_turn_bounds(msgs, text) or self.turn_bounds(msgs[:], text)
        specials = _Occurrences(self.special_tokens, text)
        trained, content, turns = [], [], []
        for i, message in enumerate(conversation.messages):
            start, end = bounds[i], bounds[i + 1]
            on = self.trained(message)
            turns.append((start, end, on))
            where = _locate(text, message.content, start, end, specials)
            if where is not None:
                content.append(where)
            if not on:
                continue
            blocks = [(a, b) for a, b in generation if start <= a < end and b > a]
            trained += [(start, end)] if self.train_on_input or not blocks else blocks
        return Rendered(text, merge_spans(trained), tuple(content), tuple(turns))


def _llama3(messages) -> tuple[str, list[tuple[int, int]]]:
    """assets/chat_templates/llama3.jinja without a generation prompt, in Python: its text and
    generation spans, and the loop positions recorded in `messages` (a TrackedMessages) as
    the template's loop records them. Jinja's ``trim`` is ``str.strip()``."""
    pieces, spans, positions, at = [], [], [], 0
    for i, message in enumerate(list.__iter__(messages)):
        positions.append(at)
        role = message["role"]
        head = "<|start_header_id|>" + role + "<|end_header_id|>\n\n"
        if i == 0:
            head = "<|begin_of_text|>" + head
        body = message["content"].strip() + "<|eot_id|>"
        at += len(head)
        if role == "assistant":
            spans.append((at, at + len(body)))
        at += len(body)
        pieces += (head, body)
    if isinstance(messages, TrackedMessages):
        messages.positions.extend(positions)
    return "".join(pieces), spans


# Built-ins rendered by Python twins of their Jinja (which stays what users read and what the
# twins are tested equal to: tests/convert/sft/test_python_renderers.py). Why: Jinja's
# per-render setup and generator cost ~3/4 of the SFT pipeline's render time on the chat
# sample, the render itself ~a third of a record's cost.
_PYTHON_BUILTINS = {"llama3": _llama3}
_BUILTIN_SOURCES: dict[str, str] = {}


def python_renderer(name: str, source: str):
    """The Python twin of built-in `name` if `source` is that built-in's own Jinja, else None."""
    twin = _PYTHON_BUILTINS.get(name)
    if twin is None:
        return None
    if name not in _BUILTIN_SOURCES:
        from importlib import resources

        asset = resources.files("shardtok") / "assets" / "chat_templates" / f"{name}.jinja"
        _BUILTIN_SOURCES[name] = asset.read_text(encoding="utf-8")
    return twin if source == _BUILTIN_SOURCES[name] else None


_PATTERNS: dict[tuple[str, ...], re.Pattern] = {}


class _Occurrences:
    """Where special-token strings occur in a text, found only when first asked."""

    def __init__(self, tokens: tuple[str, ...], text: str):
        self.tokens, self.text, self._spans = tokens, text, None

    def cutting(self, start: int, end: int) -> bool:
        """Whether [start, end) cuts a special-token string in two."""
        if self._spans is None:
            pattern = _PATTERNS.get(self.tokens)
            if pattern is None and self.tokens:  # one alternation, the longest string first
                pattern = re.compile("|".join(map(re.escape, self.tokens)))
                _PATTERNS[self.tokens] = pattern
            self._spans = [m.span() for m in pattern.finditer(self.text)] if pattern else []
        return any(a < end and b > start and not (start <= a and b <= end) for a, b in self._spans)


def _locate(text, content, start, end, specials: _Occurrences) -> tuple[int, int] | None:
    """Where `content` (or its trimmed form, as Llama 3 renders it) lies in the turn.

    Several matches (content "user" and the header "<|im_start|>user"): the last one that cuts
    no special-token string in two, since templates put the content after the header."""
    for needle in dict.fromkeys((content, content.strip())):
        if not needle:
            return None
        found, at = [], text.find(needle, start, end)
        while at != -1:
            found.append((at, at + len(needle)))
            at = text.find(needle, at + 1, end)
        if len(found) > 1:
            found = [s for s in found if not specials.cutting(*s)] or found
        if found:
            return found[-1]
    return None
