"""Field checks shared by the manifest and the shard json: a value of the wrong type or sign is
refused where it is parsed, so no later arithmetic (sums, offsets, allocations) ever sees it."""

from __future__ import annotations

import re

import numpy as np

from shardtok.format.mmidx import token_dtype

# Plain relative file names: no separators, no scheme, no leading dot (so no "..", no hidden
# temporary files), nothing a URL or a shell would read differently.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,254}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def want_int(doc: dict, key: str, fail, minimum: int | None = 0, maximum: int | None = None) -> int:
    """`doc[key]` as an int in [minimum, maximum]; JSON booleans, floats and strings are refused
    (``int()`` would quietly turn ``true``, ``1.9`` or ``"12"`` into a count)."""
    if key not in doc:
        raise fail(f"field {key!r} is missing")
    value = doc[key]
    if type(value) is not int:
        raise fail(f"field {key!r} is {value!r}, not an integer")
    if minimum is not None and value < minimum:
        raise fail(f"field {key!r} is {value}, below {minimum}")
    if maximum is not None and value > maximum:
        raise fail(f"field {key!r} is {value}, above {maximum}")
    return value


def want_str(doc: dict, key: str, fail) -> str:
    if key not in doc:
        raise fail(f"field {key!r} is missing")
    value = doc[key]
    if not isinstance(value, str):
        raise fail(f"field {key!r} is {value!r}, not a string")
    return value


def want_sha256(doc: dict, key: str, fail) -> str:
    value = want_str(doc, key, fail)
    if not _SHA256.fullmatch(value):
        raise fail(f"field {key!r} is {value!r}, not a lowercase hex sha256")
    return value


def want_dict(doc: dict, key: str, fail) -> dict:
    """An optional object field (null or absent reads as empty, as earlier releases wrote)."""
    value = doc.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise fail(f"field {key!r} is {value!r}, not an object")
    return dict(value)


def is_plain_name(name: object) -> bool:
    return isinstance(name, str) and bool(_PLAIN_NAME.fullmatch(name)) and ".." not in name


def want_plain_name(doc: dict, key: str, fail) -> str:
    value = want_str(doc, key, fail)
    if not is_plain_name(value):
        raise fail(
            f"field {key!r} is {value!r}: a file name here is [A-Za-z0-9._-] only, "
            "without a leading dot, '..', separators or a scheme"
        )
    return value


def check_vocab(vocab_size: int, dtype: np.dtype, fail) -> None:
    """Every id below `vocab_size` must be storable in `dtype` (a larger vocabulary would mean
    ids that the token bytes cannot hold, i.e. metadata that contradicts the data)."""
    limit = int(np.iinfo(dtype).max) + 1
    if not 0 < vocab_size <= limit:
        raise fail(f"vocab_size {vocab_size} does not fit {dtype} token ids (1..{limit})")


def want_token_fields(doc: dict, fail) -> tuple[np.dtype, int]:
    """The ``dtype`` and ``vocab_size`` fields of a manifest or a shard's json, checked against
    each other (every id below the vocabulary must fit the dtype)."""
    try:
        dtype = token_dtype(want_str(doc, "dtype", fail))
    except (TypeError, ValueError) as exc:
        raise fail(f"field 'dtype': {exc}") from None
    vocab_size = want_int(doc, "vocab_size", fail, minimum=1)
    check_vocab(vocab_size, dtype, fail)
    return dtype, vocab_size
