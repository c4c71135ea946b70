"""What the output folder holds before and after a conversion, and tidying it.

States at start: empty or missing (start fresh); an unfinished conversion with the same plan
(resume); an unfinished one with another plan (discard it and start fresh); a finished dataset
from other settings, or foreign files (refuse unless --overwrite); the finished dataset of this
very command (nothing to do).
Only shardtok's own names are ever deleted: the shard files of this dataset name, index.json,
rejects.jsonl, their temporary files and the work folder.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import tempfile
from pathlib import Path

from shardtok.convert.job.output_lock import LOCK_NAME
from shardtok.convert.job.workdir import WORK_DIR_NAME, WorkDir
from shardtok.errors import ShardtokError
from shardtok.format.compact_manifest import COMPACT_NAME
from shardtok.format.manifest import MANIFEST_NAME, Manifest
from shardtok.storage.folder import SCRATCH_PREFIX, Folder, temporary_name
from shardtok.storage.location import Location

logger = logging.getLogger(__name__)

REJECTS_NAME = "rejects.jsonl"
# Temporary names: ".NAME.tmp-PID" (older writers) or ".NAME.tmp-PID-RANDOM" (temporary_name).
_TMP = r"(\.tmp-\d+(-[0-9a-f]+)?)?"


class OutputDirError(ShardtokError):
    """The output folder holds something this conversion must not silently replace."""


def resolve_output(output: str) -> str:
    """The OS path of --output (a path or ``file://`` URL) for the one-command convert, whose
    lock (an flock, see output_lock) exists only on a local file system: a remote URL is
    refused here. The phase commands take any URL through output_folder()."""
    where = Location.of(output)
    if not where.is_local:
        raise OutputDirError(
            f"--output {where.display}: only a local folder (or file:// URL) can be written by "
            "a one-command convert; use the phase commands (convert plan / run-units / merge) "
            "for an object store"
        )
    return where.local_path


def output_folder(output: str, storage_options: dict | None = None) -> Folder:
    """The folder --output names, local or remote (any fsspec URL), for the phase commands.

    Nothing locks it: a remote output has no lock at all (object stores have no flock), so the
    phases rely on their own rules instead: unit files are deterministic and written marker
    last, and only plan and merge delete anything. A local path naming a file is refused."""
    folder = Folder(output, storage_options)
    if folder.is_local:
        refuse_file_output(Path(folder.location.local_path))
    return folder


def _folder(out: Path | str | Folder) -> Folder:
    return out if isinstance(out, Folder) else Folder(out)


def _ours(name: str, dataset_name: str) -> bool:
    shard = re.fullmatch(rf"\.?{re.escape(dataset_name)}-\d{{6}}\.tar{_TMP}", name)
    names = "|".join(map(re.escape, (MANIFEST_NAME, COMPACT_NAME, REJECTS_NAME)))
    own = re.fullmatch(rf"\.?({names}){_TMP}", name)
    return bool(
        shard
        or own
        or name in (WORK_DIR_NAME, LOCK_NAME)
        or name.startswith(WORK_DIR_NAME + ".trash-")
        or name.startswith(SCRATCH_PREFIX)
    )


def refuse_file_output(out: Path) -> None:
    """An existing file where the dataset folder should be is a user's mistake, said plainly."""
    if out.exists() and not out.is_dir():
        raise OutputDirError(f"{out} is a file, not a folder; choose a folder for the dataset")


def make_output_folder(out: Path) -> None:
    refuse_file_output(out)
    out.mkdir(parents=True, exist_ok=True)


def _entries(folder: Folder) -> list[str]:
    if folder.is_local and not os.path.isdir(folder.location.local_path):
        return []
    return folder.list()


def clear_output(out: Path | Folder, dataset_name: str) -> None:
    """--overwrite: delete everything a previous conversion named `dataset_name` left in `out`."""
    folder = _folder(out)
    for name in _entries(folder):
        if _ours(name, dataset_name) and name != LOCK_NAME:  # held by this run
            folder.delete(name)


def sweep_temporaries(out: Path | Folder, dataset_name: str) -> None:
    """Temporary shard/manifest files and scratch folders of a killed run (their final names are
    rewritten anyway). Only for a process that knows nobody else writes there now."""
    folder = _folder(out)
    for name in _entries(folder):
        temporary = name.startswith(".") and ".tmp-" in name
        if (temporary or name.startswith(SCRATCH_PREFIX)) and _ours(name, dataset_name):
            folder.delete(name)


def foreign_entries(out: Path | Folder, dataset_name: str) -> list[str]:
    return sorted(name for name in _entries(_folder(out)) if not _ours(name, dataset_name))


def finished_manifest(out: Path | Folder) -> Manifest | None:
    """The dataset manifest in `out`, or None when there is none or it does not parse."""
    folder = _folder(out)
    try:
        data = folder.read_bytes(MANIFEST_NAME)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    try:
        return Manifest.from_bytes(data, folder.display_of(MANIFEST_NAME))
    except ShardtokError:
        return None


def remove_stale_shards(out: Path | Folder, manifest: Manifest) -> None:
    """Shards of an earlier, longer attempt that the new manifest does not list."""
    folder = _folder(out)
    listed = {s.file for s in manifest.shards}
    for name in _entries(folder):
        if re.fullmatch(rf"{re.escape(manifest.name)}-\d{{6}}\.tar", name) and name not in listed:
            folder.delete(name)


def prepare_output(
    out: Path | Folder, dataset_name: str, plan: dict, settings: dict, overwrite: bool
) -> tuple[WorkDir, Manifest | None]:
    """Get `out` ready; returns the work folder and, when this job is already done, its manifest.

    Sweeps temporaries: only for a process that knows no one else writes in `out` now."""
    folder = _folder(out)
    workdir = WorkDir(folder)
    if overwrite:
        clear_output(folder, dataset_name)
    folder.make()
    workdir.sweep_trash()
    sweep_temporaries(folder, dataset_name)
    existing_plan = workdir.read_plan() if workdir.exists() else None
    if existing_plan == plan:
        workdir.sweep_temporaries()
        return workdir, None
    if existing_plan is not None:
        # Typically: a run stopped at a bad record, the input was fixed, and this is the rerun.
        # The unfinished work is only our own cache, so it is discarded rather than refused.
        found = existing_plan.get("version") if isinstance(existing_plan, dict) else None
        ours = plan.get("version")
        why = (
            f"of plan version {found} (this release plans version {ours})"
            if isinstance(found, int) and found != ours
            else "of other inputs or options"
        )
        logger.warning("%s held unfinished work %s; starting over", folder.display, why)
        workdir.start(plan)
        return workdir, None
    manifest = finished_manifest(folder)
    if manifest is not None:
        if manifest.extra.get("convert") == settings:
            return workdir, manifest
        raise OutputDirError(
            f"{folder.display} already holds a dataset converted from other inputs or options "
            "(pass --overwrite to replace it, or choose another --output)"
        )
    foreign = foreign_entries(folder, dataset_name)
    if foreign:
        shown = ", ".join(foreign[:5]) + (" ..." if len(foreign) > 5 else "")
        raise OutputDirError(
            f"output folder {folder.display} is not empty ({shown}); choose an empty or new folder"
        )
    workdir.start(plan)
    return workdir, None


def prepare_new_dataset(out: Path, overwrite: bool) -> None:
    """For writers that never resume (import-megatron): refuse to replace a dataset unless
    `overwrite`, as convert does, and never write among foreign files."""
    make_output_folder(out)
    manifest = finished_manifest(out)
    if (out / MANIFEST_NAME).exists():
        if not overwrite:
            raise OutputDirError(
                f"{out} already holds a dataset (pass --overwrite to replace it, or choose "
                "another output folder)"
            )
        clear_output(out, manifest.name if manifest is not None else "shard")
    foreign = foreign_entries(out, "shard")
    if foreign:
        shown = ", ".join(foreign[:5]) + (" ..." if len(foreign) > 5 else "")
        raise OutputDirError(
            f"output folder {out} is not empty ({shown}); choose an empty or new folder"
        )


class RejectsFile:
    """rejects.jsonl under --on-bad-record skip: streamed to a temporary file, published at the
    end (locally a rename; remotely one plain PUT from a local temporary file)."""

    def __init__(self, out: Path | Folder):
        self.folder = _folder(out)
        if self.folder.is_local:
            self.path = Path(self.folder.url(REJECTS_NAME))
            self._tmp = self.path.with_name(temporary_name(REJECTS_NAME))
        else:
            self.path = None
            fd, name = tempfile.mkstemp(prefix="shardtok-rejects-")
            os.close(fd)
            self._tmp = Path(name)
        self._file = open(self._tmp, "wb")  # noqa: SIM115 (closed in commit/discard)

    def write(self, file: str, line: int, reason: str, detail: str) -> None:
        """One line of rejects.jsonl (the only writer of its lines)."""
        record = {"file": file, "line": line, "reason": reason, "detail": detail}
        self._file.write(json.dumps(record, ensure_ascii=False).encode("utf-8") + b"\n")

    def commit(self) -> Path | str:
        """The published file: its path when local, its URL as printed otherwise."""
        self._file.close()
        if self.path is not None:
            os.replace(self._tmp, self.path)
            return self.path
        self.folder.put_file(REJECTS_NAME, self._tmp)
        return self.folder.display_of(REJECTS_NAME)  # never the credentials a URL may hold

    def discard(self) -> None:
        # Flushing fails on a full disk: the error being reported already says so.
        with contextlib.suppress(OSError):
            self._file.close()
        self._tmp.unlink(missing_ok=True)
