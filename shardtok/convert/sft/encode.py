"""A rendered conversation to token ids and a 0/1 loss mask, encoding the string once.

The whole rendered string is encoded in one call with offsets, exactly as the model will see it
at inference, and a token is trained when the characters it covers overlap a trained span. No
token patterns are searched and no segment is encoded on its own (both give ids the model never
sees); the one exception is ``split_special_tokens``, below. A token that is partly inside and
partly outside a trained span (``"\\n\\nSure"`` after a template's ``":"`` can merge) is trained
and counted in ``boundary_tokens``.

Offsets are the tokens' true character coverage: a post-processor that trims them (ByteLevel
or RoBERTa with ``trim_offsets``, which would drop a token's leading space from its range) is
switched off in this process's copy of the tokenizer; post-processors add no ids without
``add_special_tokens``, so the ids are the same.

Special tokens may only come from template text. A special-token string in a message's content
is a bad record ``special_token_in_content``, unless ``split_special_tokens``: then the string is
cut exactly where the tokenizer itself cuts (at the template's special tokens), each piece is
encoded with special tokens treated as text, and the template's special tokens stay control
tokens. Whether that is the same as encoding the whole string is checked on a probe text when
the encoder is built.
"""

from __future__ import annotations

import bisect
import itertools
import json
from dataclasses import dataclass

import numpy as np

from shardtok.convert.sft.conversation import (
    INVALID_CONVERSATION,
    NO_LOSS_TOKENS,
    SPECIAL_TOKEN_IN_CONTENT,
    TOO_LONG,
    Conversation,
    Rendered,
    SFTBad,
)
from shardtok.convert.sft.render import RenderRefused
from shardtok.errors import UsageError

TRUNCATIONS = ("drop", "turns", "keep_start")


@dataclass(frozen=True, slots=True)
class EncodedRecord:
    """One conversation as tokens: ``mask[i]`` is 1 when ``ids[i]`` is a training target."""

    ids: np.ndarray  # spec.dtype
    mask: np.ndarray  # uint8, same length
    boundary_tokens: int  # trained tokens that also cover untrained characters
    truncated: bool

    @property
    def trained_tokens(self) -> int:
        return int(self.mask.sum())


def _untrimmed(backend_json: str) -> tuple[str, bool]:
    """`backend_json` with every ``trim_offsets`` of its post-processor off, and whether any was on."""
    doc = json.loads(backend_json)
    changed = False

    def walk(node):
        nonlocal changed
        if isinstance(node, dict):
            if node.get("trim_offsets"):
                node["trim_offsets"] = False
                changed = True
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc.get("post_processor"))
    return (json.dumps(doc) if changed else backend_json), changed


class SFTEncoder:
    """Built in each worker from a TokenizerSpec; ``encode(conversation, renderer)``."""

    def __init__(
        self,
        spec,
        *,
        max_tokens: int | None,
        truncation: str = "drop",
        split_special_tokens: bool = False,
    ):
        from tokenizers import Tokenizer

        if truncation not in TRUNCATIONS:
            raise UsageError(
                f"truncation must be one of {', '.join(TRUNCATIONS)}, not {truncation!r}"
            )
        if max_tokens is not None and max_tokens < 1:
            raise UsageError(f"max_tokens must be a positive number of tokens, not {max_tokens}")
        self.spec = spec
        self.dtype = np.dtype(spec.dtype)
        self.max_tokens = max_tokens
        self.truncation = truncation
        self.split_special_tokens = split_special_tokens
        source, trimmed = _untrimmed(spec.backend_json)
        self._source = source
        self._tokenizer = Tokenizer.from_str(source) if trimmed else self._inherited(spec)
        added = self._tokenizer.get_added_tokens_decoder().values()
        self.special_tokens = tuple(
            sorted({t.content for t in added if t.special}, key=lambda t: (-len(t), t))
        )
        self._pattern = None
        if self.special_tokens:
            import re

            self._pattern = re.compile("|".join(map(re.escape, self.special_tokens)))
        self._text_tokenizer = None  # special tokens as text: split_special_tokens only
        if split_special_tokens and self.special_tokens:
            self._check_split()

    @staticmethod
    def _inherited(spec):
        from tokenizers import Tokenizer

        from shardtok.convert.tokenizing.tokenizer import _LOADED_BACKENDS

        backend = _LOADED_BACKENDS.get(spec.fingerprint)
        return backend if backend is not None else Tokenizer.from_str(spec.backend_json)

    # -- encoding ---------------------------------------------------------------------------

    def encode(self, conversation: Conversation, renderer) -> EncodedRecord | SFTBad:
        """Render `conversation` with `renderer` (anything with ``.render(Conversation) ->
        Rendered``), encode it, mask it and fit it into ``max_tokens``."""
        rendered = self._render(conversation, renderer)
        if isinstance(rendered, SFTBad):
            return rendered
        split = self._content_specials(conversation, rendered)
        if isinstance(split, SFTBad):
            return split
        ids, mask, boundary, starts = self._tokens(rendered, split)
        truncated = False
        if self.max_tokens is not None and len(ids) > self.max_tokens:
            truncated = True
            fitted = self._fit(conversation, renderer, rendered, split, ids, mask, boundary, starts)
            if isinstance(fitted, SFTBad):
                return fitted
            ids, mask, boundary = fitted
        if not mask.any():
            why = " after truncation" if truncated else ""
            return SFTBad(NO_LOSS_TOKENS, f"no token of the {len(ids)} is trained{why}")
        return EncodedRecord(self._ids(ids), mask.astype(np.uint8), int(boundary.sum()), truncated)

    @staticmethod
    def _render(conversation, renderer) -> Rendered | SFTBad:
        try:
            return renderer.render(conversation)
        except RenderRefused as exc:
            return SFTBad(INVALID_CONVERSATION, exc.detail)

    def _ids(self, ids: np.ndarray) -> np.ndarray:
        if ids.size and int(ids.max()) > np.iinfo(self.dtype).max:
            raise ValueError(f"token id {int(ids.max())} does not fit {self.dtype}")
        return ids.astype(self.dtype)

    def _tokens(self, rendered: Rendered, split: bool):
        """(ids int64, trained bool, boundary bool, first character) per token."""
        text = rendered.text
        if split:
            ids, offsets = self._encode_split(rendered)
        else:
            encoding = self._tokenizer.encode(text, add_special_tokens=False)
            ids, offsets = encoding.ids, encoding.offsets
        n = len(ids)
        ids = np.fromiter(ids, dtype=np.int64, count=n)
        # fromiter over the flattened pairs: half the time of asarray on a list of tuples.
        flat = itertools.chain.from_iterable(offsets)
        offsets = np.fromiter(flat, dtype=np.int64, count=2 * n).reshape(n, 2)
        trained, boundary = _overlap(rendered.trained, len(text), offsets[:, 0], offsets[:, 1])
        return ids, trained, boundary, offsets[:, 0]

    # -- length -----------------------------------------------------------------------------

    def _fit(self, conversation, renderer, rendered, split, ids, mask, boundary, starts):
        limit = self.max_tokens
        if self.truncation == "drop":
            return SFTBad(TOO_LONG, f"{len(ids)} tokens > max_tokens {limit}")
        if self.truncation == "keep_start":
            if not mask[:limit].any():
                return SFTBad(
                    NO_LOSS_TOKENS,
                    f"truncation keep_start keeps the first {limit} of {len(ids)} tokens, "
                    "none of them trained",
                )
            return ids[:limit], mask[:limit], boundary[:limit]
        return self._fit_turns(conversation, renderer, rendered, split, starts)

    def _fit_turns(self, conversation, renderer, rendered, split, starts):
        """The longest prefix of whole messages that ends after a trained turn and fits."""
        limit, total = self.max_tokens, len(starts)
        turns = rendered.turns
        if len(turns) != len(conversation.messages):
            return SFTBad(TOO_LONG, f"{total} tokens > max_tokens {limit} (no turns to drop)")
        for keep in range(len(turns) - 1, 0, -1):
            # Tokens of the whole text that start in the kept turns: the prefix encodes the
            # same up to its last few pre-tokens, so far too many means it cannot fit.
            if not turns[keep - 1][2] or np.searchsorted(starts, turns[keep - 1][1]) > limit + 32:
                continue
            shorter = Conversation(conversation.messages[:keep])
            again = self._render(shorter, renderer)
            if isinstance(again, SFTBad):
                return again
            ids, mask, boundary, _ = self._tokens(again, split)
            if len(ids) <= limit and mask.any():
                return ids, mask, boundary
        return SFTBad(
            NO_LOSS_TOKENS,
            f"truncation turns: {total} tokens > max_tokens {limit}, and no prefix of the "
            "conversation that ends after a trained turn fits",
        )

    # -- special tokens ---------------------------------------------------------------------

    def _content_specials(self, conversation, rendered) -> bool | SFTBad:
        """Whether content holds special-token strings (to be split), or the bad record."""
        pattern = self._pattern
        if pattern is None:
            return False
        found = 0
        for i, message in enumerate(conversation.messages):
            for hit in pattern.finditer(message.content):
                if not self.split_special_tokens:
                    return SFTBad(
                        SPECIAL_TOKEN_IN_CONTENT,
                        f"message {i} ({message.role}) contains {hit.group()!r} at character "
                        f"{hit.start()}",
                    )
                found += 1
        spans = sorted(rendered.content)
        span_starts = [a for a, _ in spans]
        inside = 0
        for hit in pattern.finditer(rendered.text):
            start, end = hit.span()
            at = bisect.bisect_right(span_starts, start) - 1  # the span starting at or before
            near = spans[max(at, 0) : at + 2]
            if any(a <= start and end <= b for a, b in near):
                inside += 1
            elif any(a < end and b > start for a, b in near):
                return SFTBad(
                    SPECIAL_TOKEN_IN_CONTENT,
                    f"{hit.group()!r} at character {start} of the rendered text is made of "
                    "a message's content and the text next to it",
                )
        if inside < found:
            return SFTBad(
                SPECIAL_TOKEN_IN_CONTENT,
                f"{found} special-token strings in the messages, {inside} of them found in the "
                "rendered content (the template changes the content), so they cannot be "
                "encoded as text",
            )
        return found > 0

    def _encode_split(self, rendered: Rendered):
        """Encode with content's special-token strings as text (see the module docstring)."""
        text = rendered.text
        cuts = []  # the template's special tokens: (start, end, id)
        for hit in self._pattern.finditer(text):
            start, end = hit.span()
            if not any(a < end and b > start for a, b in rendered.content):
                cuts.append((start, end, self._tokenizer.token_to_id(hit.group())))
        ids, offsets, at = [], [], 0
        for start, end, token_id in [*cuts, (len(text), len(text), None)]:
            if start > at:
                piece = self._text_tokenizer.encode(text[at:start], add_special_tokens=False)
                ids += piece.ids
                offsets += [(a + at, b + at) for a, b in piece.offsets]
            if token_id is not None:
                ids.append(token_id)
                offsets.append((start, end))
            at = end
        return ids, offsets

    def _check_split(self) -> None:
        from tokenizers import Tokenizer

        self._text_tokenizer = Tokenizer.from_str(self._source)
        self._text_tokenizer.encode_special_tokens = True
        # Encoding the pieces between special tokens on their own must give the ids of the
        # whole string (it does for byte-level BPEs; a tokenizer that prefixes each piece, like
        # SentencePiece's "first" Metaspace, would not).
        token = self.special_tokens[-1]
        probe = f"Hi there{token}Hi{token}\n\n x, y {token} there{token}"
        whole = self._tokenizer.encode(probe, add_special_tokens=False)
        ids, _ = self._encode_split(Rendered(probe, ()))
        if ids != whole.ids:
            raise UsageError(
                "split_special_tokens cannot be used with this tokenizer: it encodes the text "
                "between special tokens differently on its own; remove the special-token "
                "strings from the records instead"
            )


def _overlap(spans, length: int, starts: np.ndarray, ends: np.ndarray):
    """(trained, boundary) per token: a token is trained when the characters it covers overlap
    a trained span, boundary when it also covers untrained characters."""
    marks = np.zeros(length + 1, dtype=np.int64)
    for a, b in spans:
        marks[a] += 1
        marks[b] -= 1
    inside = np.cumsum(marks[:-1]) > 0
    before = np.zeros(length + 1, dtype=np.int64)  # trained characters before each position
    np.cumsum(inside, out=before[1:])
    # A token covering no character (a normalizer's insertion) counts as the character after it.
    width = ends - starts
    probe_ends = np.where(width > 0, ends, np.minimum(starts + 1, length))
    covered = before[probe_ends] - before[starts]
    trained = covered > 0
    boundary = trained & (covered < np.maximum(width, 1))
    return trained, boundary
