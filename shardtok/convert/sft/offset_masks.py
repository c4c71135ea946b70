"""Which tokens a rendered record's trained spans cover, from tokenizers' character offsets.

The tokenizers path of the SFT encoder (encode.py); tiktoken_masks.py does the same from token
byte lengths. A token is trained when the characters it covers overlap a trained span, and a
boundary token when it also covers untrained ones.
"""

from __future__ import annotations

import itertools

import numpy as np


def offsets_array(offsets) -> np.ndarray:
    n = len(offsets)
    # fromiter over the flattened pairs: half the time of asarray on a list of tuples.
    flat = itertools.chain.from_iterable(offsets)
    return np.fromiter(flat, dtype=np.int64, count=2 * n).reshape(n, 2)


def span_tokens(encoding, spans, n: int):
    """overlap's (trained, boundary) from the tokens at each span's ends, for an encoding whose
    tokens cover every character with non-zero widths, in order (several byte tokens of one
    character share its range); None where a character has no token (then overlap decides)."""
    trained = np.zeros(n, dtype=bool)
    boundary = np.zeros(n, dtype=bool)
    char_to_token, token_to_chars = encoding.char_to_token, encoding.token_to_chars
    for a, b in spans:
        first, last = char_to_token(a), char_to_token(b - 1)
        if first is None or last is None:
            return None
        # char_to_token gives the first token holding a character: the rest of the last
        # character's byte tokens follow it.
        while last + 1 < n and token_to_chars(last + 1)[0] < b:
            last += 1
        trained[first : last + 1] = True
        if token_to_chars(first)[0] < a:
            boundary[first] = True
        if token_to_chars(last)[1] > b:
            boundary[last] = True
    return trained, boundary


def overlap(spans, length: int, starts: np.ndarray, ends: np.ndarray):
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
