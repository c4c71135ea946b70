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
from shardtok.convert.sft.offset_masks import offsets_array, overlap, span_tokens
from shardtok.convert.sft.render import RenderRefused
from shardtok.convert.sft.tiktoken_masks import literal_pattern
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
        if truncation not in TRUNCATIONS:
            raise UsageError(
                f"truncation must be one of {', '.join(TRUNCATIONS)}, not {truncation!r}"
            )
        if max_tokens is not None and max_tokens < 1:
            raise UsageError(f"max_tokens must be a positive number of tokens, not {max_tokens}")
        self.spec = spec
        self.dtype = np.dtype(spec.dtype)
        self._max_id = int(np.iinfo(self.dtype).max)  # np.iinfo costs microseconds a record
        self.max_tokens = max_tokens
        self.truncation = truncation
        self.split_special_tokens = split_special_tokens
        # The tokenizer as loaded: ids, added tokens, normalizer and decoder. The copy whose
        # offsets are untrimmed (_tokenizer) is made when offsets are first needed: parsing
        # Llama 3's tokenizer JSON costs ~0.5 s per worker, and the tiktoken path needs none.
        self._base = self._inherited(spec)
        self._offsets_tokenizer = None
        added = self._base.get_added_tokens_decoder().values()
        self.special_tokens = tuple(
            sorted({t.content for t in added if t.special}, key=lambda t: (-len(t), t))
        )
        self._pattern = None
        if self.special_tokens:
            self._pattern = literal_pattern(self.special_tokens)
        self._text_tokenizer = None  # special tokens as text: split_special_tokens only
        if split_special_tokens and self.special_tokens:
            self._check_split()
        # Where every character is covered by tokens of non-zero width (byte-level BPE with no
        # normalizer: nothing inserted, nothing dropped), the tokens a span overlaps are found
        # from its two ends (char_to_token) instead of every token's offsets, whose Python
        # tuples cost more than the masks they give; overlap's result either way.
        from tokenizers import decoders

        self._by_span_ends = self._base.normalizer is None and isinstance(
            self._base.decoder, decoders.ByteLevel
        )
        # Where the tiktoken gate passed, ids from tiktoken and masks from byte lengths
        # (tiktoken_masks.py): the same ids and masks for a fraction of the cost.
        self._fast = None
        if spec.backend == "tiktoken":
            from shardtok.convert.sft.tiktoken_masks import TiktokenTokens

            self._fast = TiktokenTokens(spec, self._base)
        self.last_text: str | None = None  # the last record's rendered text (the canary's)

    @property
    def _tokenizer(self):
        """The tokenizer with every trim_offsets off (encode.py's docstring), built once."""
        if self._offsets_tokenizer is None:
            from tokenizers import Tokenizer

            source, trimmed = _untrimmed(self.spec.backend_json)
            self._offsets_tokenizer = Tokenizer.from_str(source) if trimmed else self._base
        return self._offsets_tokenizer

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
        prepared = self.prepare(conversation, renderer)
        if isinstance(prepared, SFTBad):
            return prepared
        self.last_text = prepared[0].text
        return self.finish(conversation, renderer, *prepared)

    def prepare(self, conversation: Conversation, renderer) -> tuple[Rendered, bool] | SFTBad:
        """The first half of :meth:`encode`: (rendered, whether content's special-token
        strings are split) or the bad record. A worker renders a batch of records this way,
        encodes their texts in one call (:meth:`batch_ids`), then :meth:`finish` es each."""
        rendered = self._render(conversation, renderer)
        if isinstance(rendered, SFTBad):
            return rendered
        split = self._content_specials(conversation, rendered)
        if isinstance(split, SFTBad):
            return split
        return rendered, split

    def batch_ids(self, texts: list[str]) -> list[np.ndarray | None]:
        """tiktoken's ids of each rendered text (of a record whose content is not split), by
        one call for the batch where it can; None for a text left to :meth:`finish` alone
        (tokenizers, or no tiktoken)."""
        if self._fast is None:
            return [None] * len(texts)
        return self._fast.batch_ids(texts)

    def finish(
        self, conversation: Conversation, renderer, rendered: Rendered, split: bool, ids=None
    ) -> EncodedRecord | SFTBad:
        """The second half of :meth:`encode`: tokens, masks, truncation. `ids`: tiktoken's ids
        of ``rendered.text`` from :meth:`batch_ids`, or None to encode it here."""
        if ids is not None:
            ids, mask, boundary, starts = (
                ids,
                *self._fast.masks(ids, rendered.text, rendered.trained),
            )
        else:
            ids, mask, boundary, starts = self._tokens(rendered, split)
        truncated = False
        if self.max_tokens is not None and len(ids) > self.max_tokens:
            truncated = True
            starts = starts()
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
        if ids.size and int(ids.max()) > self._max_id:
            raise ValueError(f"token id {int(ids.max())} does not fit {self.dtype}")
        return ids.astype(self.dtype)

    def _tokens(self, rendered: Rendered, split: bool):
        """(ids int64, trained bool, boundary bool, a function giving each token's first
        character: only truncation asks)."""
        if self._fast is not None:
            found = self._fast_tokens(rendered, split)
            if found is not None:
                return found
        text = rendered.text
        if split:
            ids, offsets = self._encode_split(rendered)
        else:
            encoding = self._tokenizer.encode(text, add_special_tokens=False)
            ids = encoding.ids
            if self._by_span_ends:
                found = span_tokens(encoding, rendered.trained, len(ids))
                if found is not None:
                    ids = np.fromiter(ids, dtype=np.int64, count=len(ids))
                    return ids, *found, lambda: offsets_array(encoding.offsets)[:, 0]
            offsets = encoding.offsets
        ids = np.fromiter(ids, dtype=np.int64, count=len(ids))
        offsets = offsets_array(offsets)
        trained, boundary = overlap(rendered.trained, len(text), offsets[:, 0], offsets[:, 1])
        return ids, trained, boundary, lambda: offsets[:, 0]

    def _fast_tokens(self, rendered: Rendered, split: bool):
        """_tokens' answer from tiktoken, or None for a text left to tokenizers."""
        fast, text = self._fast, rendered.text
        ids = fast.split_ids(text, self._cuts(rendered)) if split else fast.ids(text)
        if ids is None:
            return None
        return ids, *fast.masks(ids, text, rendered.trained)

    def canary(self, text: str) -> str | None:
        """None if tiktoken and tokenizers give `text` the same ids (or no tiktoken is used),
        else where they differ: unit_tokenizer checks each unit's first record with it."""
        return None if self._fast is None else self._fast.canary(text, self._base)

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
            # Only that span can hold the hit, and only it and the next can cut it (the spans
            # are disjoint); written out, not as any() over a slice: most records' hits are
            # the template's own tokens, each checked here.
            if at >= 0:
                b = spans[at][1]
                if end <= b:
                    inside += 1
                    continue
                cut = b > start
            else:
                cut = False
            if cut or (at + 1 < len(spans) and spans[at + 1][0] < end):
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
        ids, offsets, at = [], [], 0
        for start, end, token_id in [*self._cuts(rendered), (len(text), len(text), None)]:
            if start > at:
                piece = self._text_tokenizer.encode(text[at:start], add_special_tokens=False)
                ids += piece.ids
                offsets += [(a + at, b + at) for a, b in piece.offsets]
            if token_id is not None:
                ids.append(token_id)
                offsets.append((start, end))
            at = end
        return ids, offsets

    def _cuts(self, rendered: Rendered) -> list[tuple[int, int, int]]:
        """(start, end, id) of the template's special tokens in the rendered text."""
        cuts = []
        for hit in self._pattern.finditer(rendered.text):
            start, end = hit.span()
            if not any(a < end and b > start for a, b in rendered.content):
                cuts.append((start, end, self._base.token_to_id(hit.group())))
        return cuts

    def _check_split(self) -> None:
        from tokenizers import Tokenizer

        self._text_tokenizer = Tokenizer.from_str(_untrimmed(self.spec.backend_json)[0])
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
