"""The Jinja environment chat templates run in, as transformers builds it (5.x).

Same sandbox, same options (trim_blocks, lstrip_blocks, loopcontrols), same globals
(``raise_exception``, ``strftime_now``, a ``tojson`` that does not escape HTML, the restricted
``dict`` and ``namespace``) and the same ``{% generation %}`` tracking: a block's span starts at
the length of everything output before it, so a template renders the text and spans that
``apply_chat_template(..., return_assistant_tokens_mask=True)`` would. Templates are untrusted
code (they come with tokenizer folders), hence the sandbox.
"""

from __future__ import annotations

import json
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


class _GenerationTracker(jinja2.ext.Extension):
    tags = {"generation"}

    def __init__(self, environment):
        super().__init__(environment)
        environment.extend(generation_tracker=self)
        self.output_length: list[int] | None = None  # one mutable int, while rendering
        self.spans: list[tuple[int, int]] | None = None

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_generation", [], [])
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _generation(self, caller):
        text = caller()
        if self.spans is not None:
            start = self.output_length[0]
            self.spans.append((start, start + len(text)))
        return text


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format):
    return datetime.now().strftime(format)


class _TemplateDict:
    # Not the dict type itself: attribute access on it could reach Python internals.
    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    # Underscore attributes on a namespace are a way out of the sandbox.
    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed attributes ({name!r})"
            )


def compile_template(source: str) -> jinja2.Template:
    """Compile `source` in a fresh sandboxed environment (raises jinja2's TemplateSyntaxError)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTracker, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env.from_string(source)


class TrackedMessages(list):
    """A messages list that records, each time a loop takes a message from it, how much text
    the template had output by then: where the top-level ``{% for message in messages %}``
    starts each message's turn. (Slices and ``reverse`` give plain lists, not recorded: copy
    it with ``messages[:]``, never ``list(messages)``, which would be recorded.)"""

    def __init__(self, messages):
        super().__init__(messages)
        self.positions: list[int] = []
        self.output_length = [0]

    def __iter__(self):
        for message in list.__iter__(self):
            self.positions.append(self.output_length[0])
            yield message


def render_tracked(template: jinja2.Template, messages, **variables):
    """(text, generation spans) of `template` rendered with ``messages=messages`` and `variables`."""
    tracker: _GenerationTracker = template.environment.generation_tracker
    length, spans, blocks = [0], [], []
    if isinstance(messages, TrackedMessages):
        messages.output_length = length
    tracker.output_length, tracker.spans = length, spans
    try:
        for block in template.generate(messages=messages, tools=None, documents=None, **variables):
            blocks.append(block)
            length[0] += len(block)
    finally:
        tracker.output_length = tracker.spans = None
    return "".join(blocks), spans
