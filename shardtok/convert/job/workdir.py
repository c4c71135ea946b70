"""The work folder (`OUT/.shardtok-work/`): the plan and every finished unit's tokens.

A unit is persisted as four files: ``unit-NNNNNN.tokens`` (the documents' tokens, concatenated,
in the dataset dtype), ``unit-NNNNNN.frames`` (the same documents cut into frames and
zstd-compressed by the worker), ``unit-NNNNNN.docs.npy`` (int64 rows: piece, record number,
token count) and last ``unit-NNNNNN.json`` (counts, rejects, the frame table, the frame settings
used and the crc32 of each of the three other files). A fine-tuning (``--sft``) unit has a fifth,
``unit-NNNNNN.mask`` (one uint8 loss-mask value per token, the documents' masks concatenated),
covered by the json's checksums like the others. NNNNNN is the unit index, at least six digits.

The json is the finished-unit marker, written after every file it vouches for: a unit whose json
exists and whose files match its checksums is never tokenized again; one whose files do not (a
disk error, a file edited or cut) is tokenized again, with a warning. Locally each file is
written under a temporary name unique to its process and host and renamed, so a SIGKILL leaves
at worst stray temporaries (swept by :meth:`WorkDir.sweep_temporaries`). On an object store each
file is one plain PUT (never a rename), visible whole or not at all. A unit's files are
deterministic, so two processes writing the same unit at once (a requeued task and its zombie)
only replace files with identical bytes.

A unit that stops the run (its first bad record under ``--on-bad-record error``, or a tokenizer
backend mismatch) leaves ``unit-NNNNNN.failed.json`` instead (see shardtok.convert.job.failures). A
done marker wins over a failure marker: saving a unit deletes the failure an earlier run left.

`plan.json` holds the fingerprint of everything that decides a unit's content (input files with
size and mtime or ETag, text key, txt mode, tokenizer fingerprint, EOS/BOS, unit size, and the
SFT settings); work from a different plan is never reused, so a unit with masks never serves a
run without them, nor the other way round.
"""

from __future__ import annotations

import io
import json
import os
import re
import secrets
import shutil
import threading
import zlib
from pathlib import Path

import numpy as np

from shardtok.convert.job.failures import (
    EncoderMismatch,
    UnitFailure,
    failure_from_json,
    failure_to_json,
)
from shardtok.convert.job.unit_result import UnitResult
from shardtok.storage.folder import SCRATCH_PREFIX, Folder, temporary_name

WORK_DIR_NAME = ".shardtok-work"
PLAN_NAME = "plan.json"
_TRASH_PREFIX = WORK_DIR_NAME + ".trash-"
_MARKER = re.compile(r"unit-(\d{6,})(\.failed)?\.json")
_UNIT_FILE = re.compile(r"unit-\d+\..*")
# np.load parses a .npy header with ast.literal_eval, and CPython 3.11 can fail two threads
# parsing at once ("SystemError: AST constructor recursion depth mismatch"): units are checked
# in a thread pool (unit_status.pending_units), so the loads here take turns.
_NPY_HEADERS = threading.Lock()


def unit_base(index: int) -> str:
    return f"unit-{index:06d}"


class ChecksumWriter:
    """Passes writes to a file and keeps their crc32, so a unit's checksum costs no re-read."""

    def __init__(self, file):
        self.file = file
        self.crc = 0

    def write(self, data) -> int:
        self.crc = zlib.crc32(data, self.crc)
        return self.file.write(data)


class WorkDir:
    """The work folder inside `out_dir` (a Folder, or a local path or URL for one).

    Works the same on a local folder and an object-store prefix; only the local one has
    temporaries and a trash to sweep, and memory-maps the units it loads (a remote unit is
    downloaded whole).
    """

    def __init__(self, out_dir: Folder | str | os.PathLike, storage_options: dict | None = None):
        self.output = out_dir if isinstance(out_dir, Folder) else Folder(out_dir, storage_options)
        self.folder = self.output.sub(WORK_DIR_NAME)

    @property
    def is_local(self) -> bool:
        return self.folder.is_local

    @property
    def path(self) -> Path:
        """The OS path of a local work folder (LocationError for a remote one)."""
        return Path(self.folder.location.local_path)

    @property
    def display(self) -> str:
        return self.folder.display

    def exists(self) -> bool:
        if self.is_local:
            return self.path.is_dir()
        return bool(self.folder.list())

    # -- plan-side files --------------------------------------------------------------------

    def _write(self, name: str, data: bytes) -> None:
        self.folder.make()
        self.folder.write_bytes(name, data)

    def write_plan(self, doc: dict) -> None:
        """plan.json: any JSON object (whoever plans decides its content)."""
        if not isinstance(doc, dict):
            raise TypeError("the plan is a JSON object")
        self._write(PLAN_NAME, json.dumps(doc, sort_keys=True, indent=1).encode())

    def read_plan(self) -> dict | None:
        """The plan, or None when there is none or it is not a JSON object (damaged, foreign)."""
        try:
            doc = json.loads(self.folder.read_bytes(PLAN_NAME))
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None

    def _plan_side_name(self, name: str) -> str:
        if name == PLAN_NAME or name.startswith(".") or _UNIT_FILE.fullmatch(name):
            raise ValueError(f"{name!r} is reserved in the work folder")
        return name

    def write_file(self, name: str, data: bytes) -> None:
        """Another plan-side file (a plain name; not plan.json, a unit's or a hidden one)."""
        self._write(self._plan_side_name(name), bytes(data))

    def read_file(self, name: str) -> bytes:
        """A file written with write_file; FileNotFoundError when there is none."""
        return self.folder.read_bytes(self._plan_side_name(name))

    def start(self, plan: dict) -> None:
        """Start an empty work folder for `plan` (anything there before is discarded)."""
        if self.is_local:
            if self.path.exists():
                shutil.rmtree(self.path)
            self.path.mkdir(parents=True)
        else:
            self.output.delete(WORK_DIR_NAME)
        self.write_plan(plan)

    def sweep_temporaries(self) -> None:
        """Remove what killed processes left half-written: temporary files and scratch folders.

        Only a process that knows no unit is being written may call this (plan, merge and the
        one-command convert before its workers start), never run-units: another rank's live
        temporaries would be deleted under it. Object stores have no temporaries."""
        if not self.is_local or not self.path.is_dir():
            return
        for entry in self.path.iterdir():
            if entry.name.startswith(SCRATCH_PREFIX) and entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            elif entry.name.startswith(".") and ".tmp-" in entry.name:
                entry.unlink(missing_ok=True)

    # -- units ------------------------------------------------------------------------------

    def unit_name(self, index: int) -> str:
        """The unit's marker as printed in messages."""
        return self.folder.display_of(unit_base(index) + ".json")

    def save_unit(
        self,
        result: UnitResult,
        tokens_tmp: Path,
        frames_tmp: Path,
        docs: np.ndarray,
        crcs: tuple[int, int],
        masks: tuple[Path, int] | None = None,
    ) -> None:
        """Publish a worker's token and frame files (with their crc32s) and, for SFT, its mask
        file (`masks`: path and crc32), then the docs array, then the marker that records every
        checksum. The files are consumed: locally they must sit on the work folder's file
        system (see Folder.scratch), since they are renamed into place."""
        self.folder.make()
        base = unit_base(result.index)
        files = {".tokens": tokens_tmp, ".frames": frames_tmp}
        if masks is not None:
            files[".mask"] = masks[0]
        docs_tmp = self._local_temporary(base + ".docs.npy", tokens_tmp)
        buffer = io.BytesIO()
        np.save(buffer, docs)
        docs_tmp.write_bytes(buffer.getvalue())
        files[".docs.npy"] = docs_tmp
        result.checksums = {
            ".tokens": crcs[0],
            ".frames": crcs[1],
            ".docs.npy": zlib.crc32(buffer.getvalue()),
        }
        if masks is not None:
            result.checksums[".mask"] = masks[1]
        self.publish_files(result.index, files)
        marker_tmp = self._local_temporary(base + ".json", tokens_tmp)
        marker_tmp.write_bytes(result.to_json())
        self.publish_marker(result.index, marker_tmp)

    @staticmethod
    def _local_temporary(name: str, beside: Path) -> Path:
        return Path(beside).with_name(temporary_name(name))

    def publish_files(self, index: int, files: dict[str, Path]) -> None:
        """The first half of saving a unit: its files but the marker (`files`: suffix -> a
        local file, consumed as by save_unit) go into place, and a failure marker an earlier
        run left is deleted. Until :meth:`publish_marker` they do not count."""
        base = unit_base(index)
        for suffix, local in files.items():
            self.folder.put_file(base + suffix, local)
        # A done unit wins over a failure an earlier run of the other mode left.
        self.folder.delete(base + ".failed.json")

    def publish_marker(self, index: int, marker: Path) -> None:
        """The second half: the marker (`marker`: a local file holding UnitResult.to_json(),
        consumed), after every file it vouches for."""
        self.folder.put_file(unit_base(index) + ".json", marker)

    def load_result(
        self,
        index: int,
        dtype: np.dtype,
        masks: bool = False,
        *,
        verify: bool = True,
        pieces: int | None = None,
    ) -> UnitResult | str | None:
        """The unit's result if it finished and its files are intact; None if it never finished
        (or was written by another unit format); else why it is damaged. `masks`: whether the
        run needs the unit's loss masks (SFT). `verify=False` skips the crc32 checks (which
        read every file: remotely a download) and checks only the marker and the sizes.
        `pieces`: the unit's piece count in the plan, which the marker must have too."""
        base = unit_base(index)
        try:
            data = self.folder.read_bytes(base + ".json")
        except FileNotFoundError:
            return None
        try:
            result = UnitResult.from_json(data)
            if result is None:
                return None
            has_masks = ".mask" in result.checksums
            sizes = {}
            for suffix in (".tokens", ".frames", ".docs.npy") + ((".mask",) if has_masks else ()):
                sizes[suffix] = self.folder.size(base + suffix)
                if sizes[suffix] is None:
                    raise FileNotFoundError(f"{base + suffix} is missing")
            # Sizes first: they cost no reading, and a file of the wrong size needs no crc.
            if result.index != index:
                return f"its marker names unit {result.index}"
            if pieces is not None and len(result.piece_records) != pieces:
                return f"its plan has {pieces} pieces and its marker {len(result.piece_records)}"
            expected = {
                ".tokens": result.num_tokens * dtype.itemsize,
                ".frames": sum(row[2] for row in result.frames),
                ".mask": result.num_tokens,
            }
            for suffix, want in expected.items():
                if suffix in sizes and sizes[suffix] != want:
                    return f"{base + suffix} is {sizes[suffix]} bytes, its marker says {want}"
            problem = _frame_table_problem(result, dtype.itemsize)
            if problem is not None:
                return f"its marker's frame table {problem}"
            if verify:
                for suffix, crc in sorted(result.checksums.items()):
                    if self.folder.crc32(base + suffix) != crc:
                        return f"{base + suffix} fails its crc32 check"
            shape = self._docs(index, mmap=True).shape
            if shape != (result.num_documents, 3):
                return f"{base}.docs.npy holds {shape}, its marker says ({result.num_documents}, 3)"
        except (OSError, ValueError, TypeError, IndexError, AttributeError, KeyError) as exc:
            return f"cannot be read back ({type(exc).__name__}: {exc})"
        if has_masks != masks or (result.sft is not None) != masks:
            # The plan keeps this from happening; a unit is never served to the wrong kind of run.
            return (
                "it has loss masks and this run has none" if has_masks else "it has no loss masks"
            )
        return result

    def discard_unit(self, index: int) -> None:
        """Drop a damaged unit's marker, so it counts as unfinished until it is redone."""
        self.folder.delete(unit_base(index) + ".json")

    def _docs(self, index: int, mmap: bool = False) -> np.ndarray:
        name = unit_base(index) + ".docs.npy"
        if self.is_local:
            return _load_npy(self.folder.url(name), mmap_mode="r" if mmap else None)
        return _load_npy(io.BytesIO(self.folder.read_bytes(name)))

    def load_docs_bytes(self, index: int) -> tuple[bytes, np.ndarray]:
        """(the unit's .docs.npy file as read, its array): its crc32 is over the file's bytes,
        so a caller checking it needs those, and parses them only once."""
        data = self.folder.read_bytes(unit_base(index) + ".docs.npy")
        return data, _load_npy(io.BytesIO(data))

    def _array(self, name: str, dtype: np.dtype) -> np.ndarray:
        """A unit file as a read-only array: memory-mapped locally, downloaded remotely."""
        if not self.is_local:
            return np.frombuffer(self.folder.read_bytes(name), dtype=dtype)
        path = self.folder.url(name)
        if not os.stat(path).st_size:
            return np.empty(0, dtype=dtype)
        return np.memmap(path, dtype=dtype, mode="r")

    def load_unit(self, index: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, docs) of a finished unit; tokens are memory-mapped when local."""
        return self.load_tokens(index, dtype), self._docs(index)

    def load_tokens(self, index: int, dtype: np.dtype) -> np.ndarray:
        """The tokens of a finished unit (memory-mapped when local)."""
        return self._array(unit_base(index) + ".tokens", dtype)

    def load_masks(self, index: int) -> np.ndarray:
        """The loss masks of a finished SFT unit (one uint8 per token)."""
        return self._array(unit_base(index) + ".mask", np.dtype(np.uint8))

    def load_frames(self, index: int) -> bytes:
        """The unit's encoded frames, concatenated (see UnitResult.frames)."""
        return self.folder.read_bytes(unit_base(index) + ".frames")

    # -- failures and status ----------------------------------------------------------------

    def save_failure(
        self, failure: UnitFailure | EncoderMismatch, stop_at_bad_record: bool
    ) -> None:
        """Record why unit `failure.index` stops the run (`stop_at_bad_record`: the mode that
        found it; see shardtok.convert.job.failures)."""
        name = unit_base(failure.index) + ".failed.json"
        self._write(name, failure_to_json(failure, stop_at_bad_record))

    def load_failure_and_mode(
        self, index: int, pieces: int | None = None
    ) -> tuple[UnitFailure | EncoderMismatch, bool] | None:
        """(the failure, stop_at_bad_record of the run that wrote it), or None when the unit
        has no well-formed failure marker (`pieces`: the unit's piece count in the plan, whose
        range the failure's piece must be in)."""
        try:
            data = self.folder.read_bytes(unit_base(index) + ".failed.json")
        except OSError:
            return None
        found = failure_from_json(data, index)
        if found is not None and pieces is not None and found[0].piece >= pieces:
            return None
        return found

    def load_failure(
        self, index: int, stop_at_bad_record: bool | None = None, pieces: int | None = None
    ) -> UnitFailure | EncoderMismatch | None:
        """The unit's recorded failure, or None. Given `stop_at_bad_record` (this run's mode),
        only a failure written under the same mode is returned: a bad record that stopped an
        ``error`` run is no failure for a ``skip`` run, which must redo the unit. `pieces`: see
        load_failure_and_mode."""
        found = self.load_failure_and_mode(index, pieces)
        if found is None or (stop_at_bad_record is not None and found[1] != stop_at_bad_record):
            return None
        return found[0]

    def markers(self) -> tuple[set[int], set[int]]:
        """(units with a done marker, units with a failure marker and no done marker), from one
        listing: no file is read, so the failures' modes and the units' checksums are not
        checked (see load_failure and load_result)."""
        done: set[int] = set()
        failed: set[int] = set()
        for name in self.folder.list():
            match = _MARKER.fullmatch(name)
            if match is None:
                continue
            index = int(match.group(1))
            if unit_base(index) != f"unit-{match.group(1)}":  # unit-0000001.json is not ours
                continue
            (failed if match.group(2) else done).add(index)
        return done, failed - done

    # -- removal ----------------------------------------------------------------------------

    def remove(self) -> None:
        """Delete the folder. Locally it is renamed first, so a kill midway never leaves a
        half-empty plan behind; remotely (no renames) the prefix is deleted recursively."""
        if not self.is_local:
            self.output.delete(WORK_DIR_NAME)
            return
        if not self.path.exists():
            return
        trash = self.path.with_name(f"{_TRASH_PREFIX}{os.getpid()}-{secrets.token_hex(4)}")
        os.replace(self.path, trash)
        shutil.rmtree(trash, ignore_errors=True)

    def sweep_trash(self) -> None:
        """Work folders a killed remove() had renamed but not yet deleted (local only)."""
        if not self.is_local:
            return
        for trash in self.path.parent.glob(_TRASH_PREFIX + "*"):
            shutil.rmtree(trash, ignore_errors=True)


def _frame_table_problem(result: UnitResult, itemsize: int) -> str | None:
    """What is wrong with the frame table of `result` on its own (the crc32 of each frame is the
    merge's to check against the tokens), or None: frames must take the documents in order,
    each frame some, and their sizes must add up to the tokens."""
    firsts = [row[0] for row in result.frames]
    if result.num_documents == 0:
        return None if not firsts else "lists frames for a unit without documents"
    if not firsts or firsts[0] != 0:
        return "does not start at the first document"
    if any(b <= a for a, b in zip(firsts, firsts[1:])) or firsts[-1] >= result.num_documents:
        return "does not take the documents in order"
    if sum(row[1] for row in result.frames) != result.num_tokens * itemsize:
        return "does not add up to the unit's tokens"
    return None


def _load_npy(source, mmap_mode=None) -> np.ndarray:
    with _NPY_HEADERS:
        return np.load(source, mmap_mode=mmap_mode, allow_pickle=False)
