"""The Jinja environment chat templates run in, as transformers builds it (5.x).

Same sandbox, same options (trim_blocks, lstrip_blocks, loopcontrols), same globals
(``raise_exception``, ``strftime_now``, a ``tojson`` that does not escape HTML, the restricted
``dict`` and ``namespace``) and the same ``{% generation %}`` tracking: a block's span starts at
the length of everything output before it, so a template renders the text and spans that
``apply_chat_template(..., return_assistant_tokens_mask=True)`` would. Templates are untrusted
code (they come with tokenizer folders), hence the sandbox.

The sandbox keeps a template away from Python's internals, not from the machine's time and
memory: nested ``range(100000)`` loops never end and ``'A' * 2000000000`` takes gigabytes. So
each render also has a budget, counted, never timed, so that a record's fate never depends on
the machine's load: MAX_STEPS loop iterations, calls, lookups and operators; no value (string
or list) longer than MAX_VALUE, refused before it is made where an operator or an argument
says how long (``*``, ``%`` and format widths, ``join``, ``replace``, a filter's or method's
width); and MAX_CHARS characters output, each loop iteration counting the template text it
writes. A render over budget raises TemplateBudgetError (a bad record, or a refusal at
start-up, naming the template line).
"""

from __future__ import annotations

import functools
import json
import re
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

MAX_STEPS = 1_000_000
MAX_VALUE = 16 << 20
MAX_CHARS = 64 << 20
_DIGITS = re.compile(r"\d{" + str(len(str(MAX_VALUE))) + ",}")


class TemplateBudgetError(jinja2.exceptions.SecurityError):
    """A render exceeded its budget (see the module docstring)."""


def _size(value) -> int:
    """Characters or items a value holds, with a list's strings counted (join's result)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list | tuple):
        return len(value) + sum(len(x) for x in value if isinstance(x, str))
    if isinstance(value, dict):
        return len(value)
    return 0


def _check_size(value, what: str):
    if _size(value) > MAX_VALUE:
        raise TemplateBudgetError(f"{what} would exceed {MAX_VALUE} characters or items")
    return value


def _check_arguments(args, kwargs, what: str) -> None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_VALUE:
            raise TemplateBudgetError(f"{what} is given {value}, more than {MAX_VALUE}")


def _check_format(fmt, what: str) -> None:
    # A width or precision ('%01000000000d', '{:>1000000000}') makes a string that long.
    if isinstance(fmt, str) and _DIGITS.search(fmt):
        raise TemplateBudgetError(f"{what} is given a format with a number over {MAX_VALUE}")


def _estimate(name: str, target, args) -> int:
    """The size join/replace would make, before they make it."""
    if name == "join" and isinstance(target, str) and args:
        items = args[0]  # sep.join(items)
        sep = target
    elif name == "join" and isinstance(target, list | tuple):
        items, sep = target, (args[0] if args and isinstance(args[0], str) else "")
    elif name == "replace" and isinstance(target, str) and len(args) >= 2:
        old, new = str(args[0]), str(args[1])
        return len(target) + (len(target) + 1) * max(len(new) - len(old), 0)
    else:
        return 0
    if not isinstance(items, list | tuple):
        return 0
    return _size(items) + len(sep) * len(items)


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


class _GenerationMarks(_GenerationTracker):
    """The tracker of the plain environment: the same spans, from a mark before and after the
    block's body instead of a CallBlock, whose caller macro is built and called for every
    block (a sixth of a built-in's render). The body then runs in the template's scope, not a
    macro's: the same text unless it sets variables, which no built-in does in a block.

    The marks see output_length up to date: render_tracked adds each yielded piece's length
    before it resumes the template, and the marks are statements between the yields."""

    def __init__(self, environment):
        super().__init__(environment)
        self._starts: list[int] = []

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        marks = [
            nodes.ExprStmt(self.call_method(m)).set_lineno(lineno) for m in ("_open", "_close")
        ]
        return [marks[0], *body, marks[1]]

    def _open(self):
        if self.spans is not None:
            self._starts.append(self.output_length[0])

    def _close(self):
        if self.spans is not None:
            self.spans.append((self._starts.pop(), self.output_length[0]))


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


class _Budget:
    def __init__(self):
        self.steps = self.chars = 0

    def step(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise TemplateBudgetError(
                f"the template takes more than {MAX_STEPS} steps (loop iterations, calls, "
                "lookups) for one conversation"
            )

    def output(self, chars: int) -> None:
        self.chars += chars
        if self.chars > MAX_CHARS:
            raise TemplateBudgetError(f"the template outputs more than {MAX_CHARS} characters")


class _BudgetedEnvironment(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, **options):
        super().__init__(finalize=self._finalize, **options)
        self.budget = _Budget()

    def _finalize(self, value):
        self.budget.output(len(value) if isinstance(value, str) else 16)
        return value

    def getattr(self, obj, attribute):
        self.budget.step()
        return super().getattr(obj, attribute)

    def getitem(self, obj, argument):
        self.budget.step()
        return super().getitem(obj, argument)

    def call_binop(self, context, operator, left, right):
        self.budget.step()
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(n, int) and isinstance(seq, str | list | tuple):
                    _check_size_of(_size(seq) * max(n, 0), "'*'")
        elif operator == "**":
            if isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
                _check_size_of(abs(left).bit_length() * max(right, 0) // 8, "'**'")
        elif operator == "%" and isinstance(left, str):
            _check_format(left, "'%'")
            _check_arguments(right if isinstance(right, tuple) else (right,), {}, "'%'")
        elif operator == "+" and all(isinstance(x, str | list | tuple) for x in (left, right)):
            _check_size_of(_size(left) + _size(right), "'+'")
        return _check_size(super().call_binop(context, operator, left, right), f"'{operator}'")

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's signature)
        __self.budget.step()
        name = getattr(__obj, "__name__", "a call")
        if getattr(__obj, "__func__", None) not in _GUARDS:
            target = getattr(__obj, "__self__", None)
            _check_arguments(args, kwargs, repr(name))
            _check_size_of(_estimate(name, target, args), repr(name))
        result = ImmutableSandboxedEnvironment.call(__self, __context, __obj, *args, **kwargs)
        return _check_size(result, repr(name))

    def wrap_str_format(self, value):
        if getattr(value, "__name__", None) in ("format", "format_map"):
            _check_format(getattr(value, "__self__", None), repr(value.__name__))
        return super().wrap_str_format(value)

    def budget_iter(self, iterable, text_chars: int):
        """A loop's iterable, charged a step and its body's template text per iteration."""
        budget = self.budget
        for item in iterable:
            budget.step()
            if text_chars:
                budget.output(text_chars)
            yield item

    def budget_concat(self, value):
        return _check_size(value, "'~'")


_GUARDS = (_BudgetedEnvironment.budget_iter, _BudgetedEnvironment.budget_concat)


def _check_size_of(size: int, what: str) -> None:
    if size > MAX_VALUE:
        raise TemplateBudgetError(f"{what} would make more than {MAX_VALUE} characters or items")


def _guarded_filter(environment: _BudgetedEnvironment, name: str, function):
    # wraps() copies jinja's pass_context/pass_environment mark: the first argument is then
    # the context, environment or eval context, not the value filtered.
    skip = 1 if getattr(function, "jinja_pass_arg", None) is not None else 0

    @functools.wraps(function)
    def guarded(*args, **kwargs):
        environment.budget.step()
        values = args[skip:]
        what = f"filter {name!r}"
        _check_arguments(values[1:], kwargs, what)
        if values:
            if name == "format":
                _check_format(values[0], what)
            _check_size_of(_estimate(name, values[0], values[1:]), what)
        return _check_size(function(*args, **kwargs), what)

    return guarded


class _Guards(NodeTransformer):
    """Routes every loop's iterable through budget_iter and every ``~`` through
    budget_concat (neither passes through an operator or call the sandbox sees)."""

    def _wrap(self, method: str, node, *extra):
        call = nodes.Call(nodes.EnvironmentAttribute(method), [node, *extra], [], None, None)
        return call.set_lineno(node.lineno)

    def visit_For(self, node):
        node = self.generic_visit(node)
        text = sum(len(d.data) for d in node.find_all(nodes.TemplateData))
        node.iter = self._wrap("budget_iter", node.iter, nodes.Const(text))
        return node

    def visit_Concat(self, node):
        return self._wrap("budget_concat", self.generic_visit(node))


def compile_template(source: str) -> jinja2.Template:
    """Compile `source` in a fresh sandboxed environment (raises jinja2's TemplateSyntaxError)."""
    env = _BudgetedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTracker, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.filters = {name: _guarded_filter(env, name, f) for name, f in env.filters.items()}
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    tree = _Guards().visit(env.parse(source))
    tree.set_environment(env)
    return env.from_string(tree)


def compile_builtin(source: str) -> jinja2.Template:
    """Compile one of shardtok's own built-in templates (assets/chat_templates) in a plain
    environment: the options, globals, filters and generation tracking of compile_template,
    without the sandbox and the budget, which cost ~3x the render. Only for shardtok's code:
    a template a user brings always goes through compile_template. The budget's refusals are
    kept by the caller, which renders a conversation too large to be clear of every budget
    (render.py's BUILTIN_LIMITS) in the sandbox."""
    env = jinja2.Environment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationMarks, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    template = env.from_string(source)
    # What Template.new_context copies out of its globals (a ChainMap) on every render, once.
    template.shardtok_globals = dict(template.globals)
    return template


class AttrMessage(dict):
    """A message dict whose keys are also attributes. Jinja's ``message.role`` tries
    ``getattr`` before ``[]``, and a plain dict's AttributeError costs more than the lookup;
    what a template sees is the same (a dict's own attributes still come first, a missing
    key is still undefined). Used by the plain environment only."""

    __slots__ = ()

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def budget_message(exc: BaseException) -> str | None:
    """``line N: why`` for a TemplateBudgetError (N: the template line running), else None."""
    if not isinstance(exc, TemplateBudgetError):
        return None
    line, tb = None, exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return str(exc) if line is None else f"line {line}: {exc}"


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
    template.environment.budget = _Budget()  # a fresh budget for each render
    length, spans, blocks = [0], [], []
    if isinstance(messages, TrackedMessages):
        messages.output_length = length
    tracker.output_length, tracker.spans = length, spans
    plain = getattr(template, "shardtok_globals", None)
    if plain is not None:
        # A built-in (compile_builtin): Template.generate's context and exception rewriting
        # without their cost (the same parent mapping new_context builds; an exception is the
        # same object, with jinja's internal frames left in its traceback).
        tracker._starts = []
        parent = {**plain, "messages": messages, "tools": None, "documents": None, **variables}
        env = template.environment
        context = env.context_class(
            env, parent, template.name, template.blocks, globals=template.globals
        )
        pieces = template.root_render_func(context)
    else:
        pieces = template.generate(messages=messages, tools=None, documents=None, **variables)
    try:
        for block in pieces:
            blocks.append(block)
            length[0] += len(block)
    finally:
        tracker.output_length = tracker.spans = None
    return "".join(blocks), spans
