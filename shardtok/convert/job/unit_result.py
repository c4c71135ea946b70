"""A finished unit's marker (``unit-NNNNNN.json``): its counts, rejects and frame table.

The marker is written last, after every file it vouches for (see workdir.py), and read back as
anyone's file: every field is checked for type and range, and its sums must hold, since its
counts and tables go straight into the record accounting and the shards.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

_UNIT_FORMAT = 3  # 2: units carry their compressed frames; 3: and their files' crc32
# An SFT unit's counts (its marker's "sft", beside "jq_rewrites"), summed by the accounting
SFT_COUNTS = ("trained_tokens", "boundary_tokens", "truncated_records")


@dataclass
class UnitResult:
    """What a worker reports and the assembler reads back: one unit's documents and accounting."""

    index: int
    num_documents: int
    num_tokens: int
    input_bytes: int
    piece_records: list[int]  # lines/rows spanned by each piece (for file line numbers)
    records_read: int
    rejects: list[list]  # [piece, record, reason, detail]
    # [first document, uncompressed size, stored size, crc32] of each frame in the .frames file
    frames: list[list[int]]
    frame_settings: list  # [frame_size, compression level or None] the frames were made with
    # crc32 of the unit's files, by suffix (".tokens", ".frames", ".docs.npy", ".mask"); set by
    # save_unit
    checksums: dict[str, int] | None = None
    # SFT units: trained_tokens, boundary_tokens, truncated_records, jq_rewrites; else None
    sft: dict | None = None

    def to_json(self) -> bytes:
        doc = dict(self.__dict__, format=_UNIT_FORMAT)
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> UnitResult | None:
        """The result, or None for a unit written by another unit format (not reusable).
        ValueError, saying what is wrong, for a marker that is not one (damaged or edited):
        every field is checked, since the counts and tables go straight into the accounting
        and the shards."""
        doc = json.loads(data)
        if not isinstance(doc, dict):
            raise ValueError("the marker is not a JSON object")
        if doc.pop("format", None) != _UNIT_FORMAT:
            return None
        _check_marker(doc)
        return cls(**doc)


def _count(value) -> bool:
    return type(value) is int and value >= 0


def _counts(value, length: int | None = None) -> bool:
    return isinstance(value, list) and all(map(_count, value)) and length in (None, len(value))


def _check_marker(doc: dict) -> None:
    """A unit marker's fields, types and internal sums (see UnitResult.from_json)."""
    fields = set(UnitResult.__dataclass_fields__)
    if set(doc) != fields:
        raise ValueError(f"the marker's fields are {sorted(doc)}, not {sorted(fields)}")
    for name in ("index", "num_documents", "num_tokens", "input_bytes", "records_read"):
        if not _count(doc[name]):
            raise ValueError(f"{name} is {doc[name]!r}, not a count")
    pieces = doc["piece_records"]
    if not _counts(pieces) or not pieces:
        raise ValueError("piece_records is not a list of counts, one per piece")
    rejects = doc["rejects"]
    if not isinstance(rejects, list) or not all(
        isinstance(r, list) and len(r) == 4 and _count(r[0]) and r[0] < len(pieces)
        and _count(r[1]) and isinstance(r[2], str) and isinstance(r[3], str)
        for r in rejects
    ):  # fmt: skip
        raise ValueError("rejects is not a list of [piece, record, reason, detail]")
    if doc["num_documents"] + len(rejects) != doc["records_read"]:
        raise ValueError("its documents and rejects do not add up to the records read")
    if not isinstance(doc["frames"], list) or not all(_counts(f, 4) for f in doc["frames"]):
        raise ValueError("frames is not a table of [document, size, stored size, crc32]")
    settings = doc["frame_settings"]
    if not (isinstance(settings, list) and len(settings) == 2 and _count(settings[0])) or not (
        settings[1] is None or _count(settings[1])
    ):
        raise ValueError("frame_settings is not [frame size, compression level or null]")
    checksums = doc["checksums"]
    if not isinstance(checksums, dict) or not all(map(_count, checksums.values())):
        raise ValueError("checksums is not a mapping of file suffixes to crc32s")
    sft = doc["sft"]
    if sft is not None and not (
        isinstance(sft, dict)
        and all(_count(sft.get(key)) for key in SFT_COUNTS)
        and isinstance(sft.get("jq_rewrites", []), list)
        and all(
            isinstance(r, list) and len(r) == 2 and all(isinstance(x, str) for x in r)
            for r in sft.get("jq_rewrites", [])
        )
    ):
        raise ValueError("sft is not the unit's fine-tuning counts")
