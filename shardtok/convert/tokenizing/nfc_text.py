"""HF's NFC step in front of a tiktoken encoding, for tokenizers whose normalizer is NFC alone.

NFC (a tokenizer whose normalizer is exactly NFC, every added token normalized=false): HF
splits the raw text at added tokens first (the non-normalized pass), normalizes each piece
between them alone, then pre-tokenizes and BPEs each normalized piece; normalized added tokens
would be matched afterwards in the normalized pieces, so the gate refuses them here (their
matches would depend on what NFC does at the pieces' edges). NfcText does the same:

- a text HF's NFC leaves unchanged (ASCII, or every piece between added tokens already NFC:
  ``unicodedata.is_normalized``) gives HF's ids without normalizing, by the proof above;
- any other text is split at the added tokens as HF splits it (no added token is a substring of
  another, so the leftmost match is the longest, as in HF's pass), each piece normalized and
  encoded with ``encode_ordinary`` (no added token looked for: HF does not look again either),
  the added tokens' ids between them. Such texts are encoded alone, never joined in a run.

Normalizing the whole text first and letting tiktoken find the added tokens afterwards is not
the same: NFC joins ``>`` and a following U+0338 into ``≯``, so ``<|im_end|>`` + U+0338 would lose
its added token (HF keeps it), and NFC can make added-token text that HF never matches
(U+037E becomes ``;``).

Unicode versions: the pieces are normalized by HF's own NFC (``tokenizers.normalizers.NFC``), so
a changed text gets HF's result whatever tables it has. Whether a text changes is asked of
Python's ``unicodedata.is_normalized`` (35x cheaper per text). That is exact when Python's Unicode
version is at least HF's (HF 0.23: older tables than Python 3.11's 14.0): by Unicode's stability
policy, characters HF knows have the same decompositions, combining classes and compositions in
Python, and a character only Python knows is a starter to HF that composes with nothing and
blocks, so HF changes nothing that Python leaves alone. The other way round is left to the probe
(decomposed, singleton, reordered, Hangul jamo and compatibility text) and the canary.
"""

from __future__ import annotations

import re
import unicodedata


class NfcText:
    """HF's NFC step in front of a tiktoken encoding (see the module docstring).

    :meth:`ids` gives None for a text that HF's normalizing leaves as it is (then tiktoken's ids
    of the text itself are HF's), else the text's ids, computed as HF computes them.
    """

    def __init__(self, encoding, specials: dict[str, int]):
        from tokenizers import normalizers

        self._ordinary = encoding.encode_ordinary
        # HF's own NFC for the pieces that change: Python's unicodedata may compose what HF's
        # older Unicode tables do not (U+11935 U+11930 -> U+11938, Unicode 13).
        self._normalize = normalizers.NFC().normalize_str
        self._specials = specials
        # Longest first: with no added token inside another the order cannot matter, but then
        # the match is HF's leftmost-longest whatever the gate allowed.
        alternatives = sorted(specials, key=len, reverse=True)
        self._split = (
            re.compile("(" + "|".join(map(re.escape, alternatives)) + ")").split
            if specials
            else None
        )
        firsts = sorted({t[0] for t in specials})
        self._firsts = firsts if len(firsts) <= 4 else None  # None: split every text

    def _pieces(self, text: str) -> list[str]:
        """[piece, added token, piece, ..., piece], as HF's first pass cuts `text`."""
        if self._split is None:
            return [text]
        if self._firsts is not None and not any(ch in text for ch in self._firsts):
            return [text]
        return self._split(text)

    def ids(self, text: str) -> list[int] | None:
        if text.isascii():  # O(1) in CPython: the common case costs nothing more
            return None
        pieces = self._pieces(text)
        normalized = unicodedata.is_normalized
        if all(normalized("NFC", piece) for piece in pieces[0::2]):
            return None
        ids: list[int] = []
        for k, piece in enumerate(pieces):
            if k % 2:
                ids.append(self._specials[piece])
            elif piece:
                ids.extend(self._ordinary(self._normalize(piece)))
        return ids
