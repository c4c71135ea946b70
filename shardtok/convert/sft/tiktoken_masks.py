"""SFT records through tiktoken: ids from tiktoken, loss masks from the tokens' byte lengths.

Why: on Llama 3 the ``tokenizers`` call with offsets and the Python around its offsets cost
more than the whole plain tiktoken conversion of the same text. Where the tokenizer's
equivalence gate passed (``tiktoken_backend.check``), tiktoken gives the ids ``tokenizers``
gives, so only the masks need another source.

Masks without offsets: a byte-level BPE's tokens are the text's UTF-8 bytes cut into pieces, in
order, each piece non-empty (an added token is its own UTF-8 text). So ``cumsum`` of each id's
byte length gives every token's byte range. ``tokenizers``' offsets give a token the characters
that hold any of its bytes, and encode.py trains a token whose characters overlap a trained span
(boundary: it also covers untrained characters). Span ends are character boundaries, so a
token's characters overlap a span exactly when its bytes overlap the span's bytes, and it covers
an untrained character exactly when it has a byte outside the (merged) spans: the same masks,
with the span ends turned into byte positions.

What stays on ``tokenizers`` (None from :meth:`TiktokenTokens.ids`, and encode.py takes its own
path for that record): a text with a lone surrogate (no UTF-8), and under an NFC normalizer
(Qwen) a text HF's NFC would change, whose tokens cover normalized characters, not the
record's. ``split_special_tokens`` pieces are encoded with no added token matched, which is
what ``tokenizers`` does with ``encode_special_tokens`` only when every added token is special;
otherwise such records stay on ``tokenizers`` too.
"""

from __future__ import annotations

import bisect
import re
import unicodedata

import numpy as np

# Per tokenizer fingerprint: every id's byte length (built once per process, ~0.05 s).
_LENGTHS: dict[str, np.ndarray] = {}


def _byte_lengths(encoding, fingerprint: str) -> np.ndarray:
    lengths = _LENGTHS.get(fingerprint)
    if lengths is None:
        ranks, specials = encoding._mergeable_ranks, encoding._special_tokens
        size = 1 + max([*ranks.values(), *specials.values()])
        lengths = np.zeros(size, dtype=np.int64)
        lengths[np.fromiter(ranks.values(), dtype=np.int64, count=len(ranks))] = np.fromiter(
            map(len, ranks), dtype=np.int64, count=len(ranks)
        )
        for text, token_id in specials.items():
            lengths[token_id] = len(text.encode("utf-8"))
        _LENGTHS[fingerprint] = lengths
    return lengths


def literal_pattern(strings) -> re.Pattern:
    """A regex matching any of `strings` at a position, the longest where several do: what an
    alternation sorted longest first matches, written as a trie. Why: Python's re tries every
    alternative of a flat alternation at each candidate position (Llama 3's 256 special tokens
    all start with ``<|``), and a trie fails at the first character no string continues with.
    """
    trie: dict = {}
    for string in strings:
        node = trie
        for ch in string:
            node = node.setdefault(ch, {})
        node[""] = {}  # the end of a string

    def regex(node: dict) -> str:
        # Longer first: a backtracking match takes the first alternative that matches.
        branches = [re.escape(ch) + regex(child) for ch, child in sorted(node.items()) if ch]
        ends = "" in node
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        if ends:
            return "(?:" + body + ")?"
        return body

    if not trie:
        raise ValueError("no strings to match")
    return re.compile(regex(trie))


class TiktokenTokens:
    """A tokenizer spec's tiktoken encoding, for SFT: ids of a rendered text and their masks."""

    def __init__(self, spec, tokenizer):
        from tokenizers import normalizers

        from shardtok.convert.tokenizing.nfc_text import NfcText
        from shardtok.convert.tokenizing.tiktoken_backend import parts_unchecked
        from shardtok.convert.tokenizing.tokenizer import _LOADED_TIKTOKEN

        encoding = _LOADED_TIKTOKEN.get(spec.fingerprint)
        if encoding is None:  # a spawned worker: the parent's gate passed, only build
            encoding = parts_unchecked(spec.backend_json).build(spec.fingerprint)
            _LOADED_TIKTOKEN[spec.fingerprint] = encoding
        self._encode = encoding.encode
        self._to_numpy = getattr(encoding, "encode_to_numpy", None)  # tiktoken >= 0.9
        self._allowed = frozenset(encoding.special_tokens_set)
        # tiktoken converts its allowed set on every call (~0.2 ms for Llama 3's 256 added
        # tokens), so only the added tokens a text holds are passed (the others cannot match).
        self._find_added = literal_pattern(self._allowed).findall if self._allowed else None
        self.added_ids = {t: encoding.encode_single_token(t) for t in self._allowed}
        self._lengths = _byte_lengths(encoding, spec.fingerprint)
        self._nfc = None
        # The gate let tiktoken through with no normalizer or NFC alone.
        if isinstance(tokenizer.normalizer, normalizers.NFC):
            self._nfc = NfcText(encoding, self.added_ids)
        added = tokenizer.get_added_tokens_decoder().values()
        # tokenizers' encode_special_tokens still matches non-special added tokens.
        self.splits = all(t.special for t in added)
        # The batch separator (batch_ids): an added token no added token ends with a proper
        # prefix of (encoder._Joiner's rule), the highest id first, since the lowest ones are
        # what templates write (Llama 3's <|begin_of_text|>) and the highest are reserved.
        self._sep = None
        if self._to_numpy is not None:
            by_id = sorted(self._allowed, key=self.added_ids.__getitem__, reverse=True)
            for sep in by_id:
                prefixes = [sep[:k] for k in range(1, len(sep))]
                if not any(s.endswith(p) for s in self._allowed for p in prefixes):
                    self._sep, self._sep_id = sep, self.added_ids[sep]
                    break

    def _array(self, text: str, allowed) -> np.ndarray | None:
        try:
            if self._to_numpy is not None:
                return self._to_numpy(text, allowed_special=allowed, disallowed_special=())
            ids = self._encode(text, allowed_special=allowed, disallowed_special=())
            return np.asarray(ids, dtype=np.uint32)
        except UnicodeEncodeError:  # a lone surrogate
            return None

    def ids(self, text: str) -> np.ndarray | None:
        """`text`'s ids with every added token matched (as ``tokenizers`` without
        add_special_tokens), or None where ``tokenizers`` must encode it (module docstring)."""
        if self._nfc is not None and not text.isascii() and self._nfc.ids(text) is not None:
            return None
        found = self._find_added(text) if self._find_added is not None else ()
        return self._array(text, frozenset(found))

    def batch_ids(self, texts: list[str]) -> list[np.ndarray | None]:
        """ids() of each of `texts`, from one tiktoken call on the texts joined by a separator
        token where it can. Why: a call per record between renders cost ~35% more per record
        than the same texts encoded back to back. Exact for the reason encoder._Joiner gives
        (tiktoken cuts at added tokens first and encodes each piece between them alone; the
        separator's rule keeps every added token found inside one text or a separator);
        ids() matches only the added tokens a text holds, which is every added token allowed.
        A text holding the separator's own text gives one separator too many: then the batch
        goes one text at a time, as it does for a lone surrogate (ids() says None for it)."""
        out: list[np.ndarray | None] = [None] * len(texts)
        todo = list(range(len(texts)))
        if self._nfc is not None:  # texts NFC changes stay on tokenizers (None)
            nfc = self._nfc.ids
            todo = [i for i in todo if texts[i].isascii() or nfc(texts[i]) is None]
        if len(todo) > 1 and self._sep is not None:
            try:
                joined = self._to_numpy(
                    self._sep.join([texts[i] for i in todo]),
                    allowed_special=self._allowed,
                    disallowed_special=(),
                )
            except UnicodeEncodeError:
                joined = None
            if joined is not None:
                cuts = np.flatnonzero(joined == self._sep_id)
                if cuts.size == len(todo) - 1:
                    starts = [0, *(cuts + 1).tolist()]
                    ends = [*cuts.tolist(), joined.size]
                    for i, a, b in zip(todo, starts, ends, strict=True):
                        out[i] = joined[a:b]
                    return out
        for i in todo:
            out[i] = self.ids(texts[i])
        return out

    def split_ids(self, text: str, cuts) -> np.ndarray | None:
        """The ids of `text` cut at `cuts` ((start, end, id) of the template's special
        tokens): each piece between them with no added token matched; None as for ids()."""
        if not self.splits:
            return None
        pieces, at = [], 0
        nothing: frozenset = frozenset()
        for start, end, token_id in [*cuts, (len(text), len(text), None)]:
            if start > at:
                piece = text[at:start]
                if (
                    self._nfc is not None
                    and not piece.isascii()
                    and not unicodedata.is_normalized("NFC", piece)
                ):
                    return None
                ids = self._array(piece, nothing)
                if ids is None:
                    return None
                pieces.append(ids)
            if token_id is not None:
                pieces.append(np.array([token_id], dtype=np.uint32))
            at = end
        if not pieces:
            return np.empty(0, dtype=np.uint32)
        return np.concatenate(pieces)

    def masks(self, ids: np.ndarray, text: str, spans):
        """(trained, boundary, a function giving each token's first character) for `ids` of
        `text` and the sorted, merged character spans `spans` (module docstring)."""
        lengths = self._lengths[ids]
        ends = lengths.cumsum()
        n = len(ids)
        trained = np.zeros(n, dtype=bool)
        boundary = np.zeros(n, dtype=bool)
        ascii_text = text.isascii()
        if spans:
            flat = [p for span in spans for p in span]
            if not ascii_text:
                flat = _byte_positions(text, flat)
            # A record has a few spans: bisect on a list costs less than numpy calls on them.
            byte_ends = ends.tolist()
            for k in range(0, len(flat), 2):
                start, end = flat[k], flat[k + 1]
                # The token holding byte `start` (the first whose end is past it) and the one
                # holding byte end - 1 (the first whose end reaches `end`).
                first = bisect.bisect_right(byte_ends, start)
                last = bisect.bisect_left(byte_ends, end, first)
                trained[first : last + 1] = True
                if (byte_ends[first - 1] if first else 0) < start:
                    boundary[first] = True
                if byte_ends[last] > end:
                    boundary[last] = True

        def first_chars() -> np.ndarray:
            starts = ends - lengths
            if ascii_text:
                return starts
            raw = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
            char_of_byte = np.cumsum((raw & 0xC0) != 0x80) - 1
            return char_of_byte[starts]

        return trained, boundary, first_chars

    def canary(self, text: str, tokenizer) -> str | None:
        """None if ``tokenizers`` gives `text` the ids this class gives it, else where they
        differ (a text this class leaves to tokenizers has nothing to compare)."""
        from shardtok.convert.tokenizing.tokenizer import describe_mismatch

        fast = self.ids(text)
        if fast is None:
            return None
        fast = fast.tolist()
        hf = tokenizer.encode(text, add_special_tokens=False).ids
        return None if fast == hf else describe_mismatch(hf, fast)


def _byte_positions(text: str, positions: list[int]) -> list[int]:
    """The UTF-8 byte offset of each character offset in `positions` (ascending)."""
    out, at, total = [], 0, 0
    for p in positions:
        if p > at:
            total += len(text[at:p].encode("utf-8"))
            at = p
        out.append(total)
    return out
