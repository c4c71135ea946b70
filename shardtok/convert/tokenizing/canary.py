"""The tiktoken canary checked in the main process, before a unit is sent to a worker.

The canary re-encodes the start of each unit's first document with tokenizers and compares it
with tiktoken's ids (see encoder.BatchEncoder.canary). tokenizers' encode holds the GIL for all
of its ~0.35 ms (1.3 KB of text): run on a worker's writer thread, it stalls the worker's
tokenizing thread, which needs the GIL after every document. The main process is mostly idle
while workers tokenize, so it finds a unit's first document there by reading only the start of
the unit's first piece, checks it, and sends the verdict with the unit
(:class:`UnitCanary`). The worker takes the verdict only for the very text it would have
checked (same piece, record and characters), and otherwise runs the canary itself, as it does
for every input this module does not read (compressed, remote, Parquet, Arrow, whole-file
text) and under engines that call worker.tokenize_unit.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardtok.convert.inputs.files import InputFile
from shardtok.convert.inputs.records import RangeReader, Reject
from shardtok.convert.inputs.units import InputRange, Unit, _next_line_start
from shardtok.convert.tokenizing.encoder import BatchEncoder
from shardtok.convert.tokenizing.tokenizer import _LOADED_BACKENDS, _LOADED_TIKTOKEN, TokenizerSpec
from shardtok.storage.location import is_local

# The start of the unit's first document is checked: about 0.5% of the input (tokenizers is
# ~8x slower than tiktoken's array encoder), at least 1 KiB.
CANARY_SHARE = 200
CANARY_MIN_CHARS = 1024
# Lines of a piece read to find its first document (blank lines and rejects are skipped);
# beyond them the worker looks, as for any unit without a verdict.
_LINES = 8


def canary_chars(unit: Unit) -> int:
    """How many characters of the unit's first document the canary checks."""
    return max(CANARY_MIN_CHARS, unit.nbytes // CANARY_SHARE)


@dataclass(frozen=True)
class Checked:
    """The canary's verdict on `text` (record `record` of the unit's piece `piece`): None, or
    where the two encoders differ."""

    piece: int
    record: int
    text: str
    mismatch: str | None

    def applies(self, piece: int, record: int, text: str) -> bool:
        return (self.piece, self.record, self.text) == (piece, record, text)


class UnitCanary:
    """Checks units' first documents in this process: :meth:`check` gives a unit's verdict,
    or None when the worker is to run the canary itself."""

    def __init__(self, spec: TokenizerSpec, files: list[InputFile], text_key: str, txt_mode: str):
        self.files = files
        self.text_key = text_key
        self.txt_mode = txt_mode
        self.encoder = BatchEncoder(spec)

    @classmethod
    def for_job(
        cls, spec: TokenizerSpec, files: list[InputFile], text_key: str, txt_mode: str, sft
    ) -> UnitCanary | None:
        """None when no unit has a canary (another backend, SFT records) or when building the
        encoders here would cost more than the canary saves (the caller did not load them in
        this process: a spawned worker's 0.5 s of parsing)."""
        if spec.backend != "tiktoken" or sft is not None:
            return None
        loaded = spec.fingerprint in _LOADED_BACKENDS and spec.fingerprint in _LOADED_TIKTOKEN
        return cls(spec, files, text_key, txt_mode) if loaded else None

    def check(self, unit: Unit) -> Checked | None:
        found = self._first_document(unit)
        if found is None:
            return None
        record, text = found
        text = text[: canary_chars(unit)]
        return Checked(0, record, text, self.encoder.canary(text))

    def _first_document(self, unit: Unit) -> tuple[int, str] | None:
        """(record, text) of the first document of the unit's first piece, read as the worker
        reads it (RangeReader over the piece's first lines), or None."""
        piece = unit.pieces[0]
        file = self.files[piece.input_index]
        lines = file.kind == "jsonl" or (file.kind == "txt" and self.txt_mode == "lines")
        if not lines or file.compression is not None or not is_local(file.path):
            return None
        try:
            with open(file.path, "rb") as f:
                end = piece.start
                for _ in range(_LINES):
                    if end >= piece.end:
                        return None
                    end = _next_line_start(f, end + 1, piece.end)
                    # The piece cut after its first lines: records are numbered as in the piece.
                    head = InputRange(piece.input_index, piece.start, end)
                    for record, item in RangeReader(file, head, self.text_key, self.txt_mode):
                        if not isinstance(item, Reject):
                            return record, item
        except Exception:  # noqa: BLE001 (the worker reads the unit again and reports it)
            return None
        return None
