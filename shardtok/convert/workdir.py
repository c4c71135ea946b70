"""The work folder (`OUT/.shardtok-work/`): the plan and every finished unit's tokens.

A unit is persisted as four files, each written under a temporary name and renamed:
``unit-NNNNNN.tokens`` (the documents' tokens, concatenated, in the dataset dtype),
``unit-NNNNNN.frames`` (the same documents cut into frames and zstd-compressed by the worker),
``unit-NNNNNN.docs.npy`` (int64 rows: piece, record number, token count) and last
``unit-NNNNNN.json`` (counts, rejects, the frame table, the frame settings used and the crc32 of
each of the three other files). A fine-tuning (``--sft``) unit has a fifth, ``unit-NNNNNN.mask``
(one uint8 loss-mask value per token, the documents' masks concatenated), covered by the json's
checksums like the others. The json is the finished-unit marker: a unit whose json exists
and whose files match its checksums is never tokenized again; one whose files do not (a disk
error, a file edited or cut) is tokenized again, with a warning. A SIGKILL leaves at worst
stray temporary files, which are ignored and swept.

`plan.json` holds the fingerprint of everything that decides a unit's content (input files with
size and mtime, text key, txt mode, tokenizer fingerprint, EOS/BOS, unit size, and the SFT
settings); work from a different plan is never reused, so a unit with masks never serves a run
without them, nor the other way round.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shardtok._checksum import file_crc32

WORK_DIR_NAME = ".shardtok-work"
_TRASH_PREFIX = WORK_DIR_NAME + ".trash-"
_UNIT_FORMAT = 3  # 2: units carry their compressed frames; 3: and their files' crc32


def atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as out:
        out.write(data)
    os.replace(tmp, path)


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
        """The result, or None for a unit written by another unit format (not reusable)."""
        doc = json.loads(data)
        if doc.pop("format", None) != _UNIT_FORMAT:
            return None
        return cls(**doc)


class ChecksumWriter:
    """Passes writes to a file and keeps their crc32, so a unit's checksum costs no re-read."""

    def __init__(self, file):
        self.file = file
        self.crc = 0

    def write(self, data) -> int:
        self.crc = zlib.crc32(data, self.crc)
        return self.file.write(data)


class WorkDir:
    def __init__(self, out_dir: Path):
        self.path = Path(out_dir) / WORK_DIR_NAME
        self.plan_path = self.path / "plan.json"

    def exists(self) -> bool:
        return self.path.is_dir()

    def read_plan(self) -> dict | None:
        try:
            return json.loads(self.plan_path.read_bytes())
        except (OSError, ValueError):
            return None

    def start(self, plan: dict) -> None:
        """Start an empty work folder for `plan` (anything there before is discarded)."""
        if self.path.exists():
            shutil.rmtree(self.path)
        self.path.mkdir(parents=True)
        atomic_write(self.plan_path, json.dumps(plan, sort_keys=True, indent=1).encode())

    def sweep_temporaries(self) -> None:
        for stray in self.path.glob(".*.tmp-*"):
            stray.unlink(missing_ok=True)

    def _base(self, index: int) -> Path:
        return self.path / f"unit-{index:06d}"

    def save_unit(
        self,
        result: UnitResult,
        tokens_tmp: Path,
        frames_tmp: Path,
        docs: np.ndarray,
        crcs: tuple[int, int],
        masks: tuple[Path, int] | None = None,
    ) -> None:
        """Move a worker's token and frame files (with their crc32s) and, for SFT, its mask file
        (`masks`: path and crc32) into place, then the docs array, then the marker that records
        every checksum."""
        base = self._base(result.index)
        os.replace(tokens_tmp, base.with_suffix(".tokens"))
        os.replace(frames_tmp, base.with_suffix(".frames"))
        if masks is not None:
            os.replace(masks[0], base.with_suffix(".mask"))
        buffer = io.BytesIO()
        np.save(buffer, docs)
        atomic_write(base.with_suffix(".docs.npy"), buffer.getvalue())
        result.checksums = {
            ".tokens": crcs[0],
            ".frames": crcs[1],
            ".docs.npy": zlib.crc32(buffer.getvalue()),
        }
        if masks is not None:
            result.checksums[".mask"] = masks[1]
        atomic_write(base.with_suffix(".json"), result.to_json())

    def token_tmp_path(self, index: int) -> Path:
        return self.path / f".unit-{index:06d}.tokens.tmp-{os.getpid()}"

    def frames_tmp_path(self, index: int) -> Path:
        return self.path / f".unit-{index:06d}.frames.tmp-{os.getpid()}"

    def mask_tmp_path(self, index: int) -> Path:
        return self.path / f".unit-{index:06d}.mask.tmp-{os.getpid()}"

    def unit_name(self, index: int) -> str:
        return str(self._base(index).with_suffix(".json"))

    def load_result(
        self, index: int, dtype: np.dtype, masks: bool = False
    ) -> UnitResult | str | None:
        """The unit's result if it finished and its files are intact; None if it never finished
        (or was written by another unit format); else why it is damaged. `masks`: whether the
        run needs the unit's loss masks (SFT)."""
        base = self._base(index)
        marker = base.with_suffix(".json")
        try:
            data = marker.read_bytes()
        except FileNotFoundError:
            return None
        try:
            result = UnitResult.from_json(data)
            if result is None:
                return None
            tokens_size = base.with_suffix(".tokens").stat().st_size
            frames_size = base.with_suffix(".frames").stat().st_size
            stored = sum(row[2] for row in result.frames)
            for suffix, crc in sorted(result.checksums.items()):
                if file_crc32(base.with_suffix(suffix)) != crc:
                    return f"{base.with_suffix(suffix).name} fails its crc32 check"
            docs_shape = np.load(base.with_suffix(".docs.npy"), mmap_mode="r").shape
            has_masks = ".mask" in result.checksums
            mask_size = base.with_suffix(".mask").stat().st_size if has_masks else 0
        except (OSError, ValueError, TypeError, IndexError, AttributeError, KeyError) as exc:
            return f"cannot be read back ({type(exc).__name__}: {exc})"
        if (
            result.index != index
            or tokens_size != result.num_tokens * dtype.itemsize
            or frames_size != stored
            or docs_shape != (result.num_documents, 3)
            or mask_size != (result.num_tokens if has_masks else 0)
        ):
            return "its files disagree with its marker in size"
        if has_masks != masks or (result.sft is not None) != masks:
            # The plan keeps this from happening; a unit is never served to the wrong kind of run.
            return (
                "it has loss masks and this run has none" if has_masks else "it has no loss masks"
            )
        return result

    def discard_unit(self, index: int) -> None:
        """Drop a damaged unit's marker, so it counts as unfinished until it is redone."""
        self._base(index).with_suffix(".json").unlink(missing_ok=True)

    def load_unit(self, index: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, docs) of a finished unit; tokens are memory-mapped."""
        base = self._base(index)
        path = base.with_suffix(".tokens")
        tokens = (
            np.memmap(path, dtype=dtype, mode="r")
            if path.stat().st_size
            else np.empty(0, dtype=dtype)
        )
        docs = np.load(base.with_suffix(".docs.npy"))
        return tokens, docs

    def load_masks(self, index: int) -> np.ndarray:
        """The loss masks of a finished SFT unit (one uint8 per token), memory-mapped."""
        path = self._base(index).with_suffix(".mask")
        if not path.stat().st_size:
            return np.empty(0, dtype=np.uint8)
        return np.memmap(path, dtype=np.uint8, mode="r")

    def load_frames(self, index: int) -> bytes:
        """The unit's encoded frames, concatenated (see UnitResult.frames)."""
        return self._base(index).with_suffix(".frames").read_bytes()

    def remove(self) -> None:
        """Delete the folder: renamed first, so a kill midway never leaves a half-empty plan behind."""
        if not self.path.exists():
            return
        trash = self.path.with_name(f"{_TRASH_PREFIX}{os.getpid()}")
        os.replace(self.path, trash)
        shutil.rmtree(trash, ignore_errors=True)

    def sweep_trash(self) -> None:
        for trash in self.path.parent.glob(_TRASH_PREFIX + "*"):
            shutil.rmtree(trash, ignore_errors=True)
