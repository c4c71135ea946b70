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
import os
import re
import shutil
import sys
from pathlib import Path

from shardtok.convert.output_lock import LOCK_NAME
from shardtok.convert.workdir import WORK_DIR_NAME, WorkDir
from shardtok.errors import ShardtokError
from shardtok.format.manifest import MANIFEST_NAME, Manifest, load_manifest
from shardtok.storage.location import Location

REJECTS_NAME = "rejects.jsonl"


class OutputDirError(ShardtokError):
    """The output folder holds something this conversion must not silently replace."""


def resolve_output(output: str) -> str:
    """The OS path of --output (a path or ``file://`` URL). Shards are written with local
    renames and fsyncs, which object stores do not offer, so a remote URL is refused."""
    where = Location.of(output)
    if not where.is_local:
        raise OutputDirError(
            f"--output {where.display}: only a local folder (or file:// URL) can be written; "
            "convert locally, then upload the folder"
        )
    return where.local_path


def _ours(name: str, dataset_name: str) -> bool:
    shard = re.fullmatch(rf"\.?{re.escape(dataset_name)}-\d{{6}}\.tar(\.tmp-\d+)?", name)
    own = re.fullmatch(
        rf"\.?({re.escape(MANIFEST_NAME)}|{re.escape(REJECTS_NAME)})(\.tmp-\d+)?", name
    )
    return bool(
        shard
        or own
        or name in (WORK_DIR_NAME, LOCK_NAME)
        or name.startswith(WORK_DIR_NAME + ".trash-")
    )


def refuse_file_output(out: Path) -> None:
    """An existing file where the dataset folder should be is a user's mistake, said plainly."""
    if out.exists() and not out.is_dir():
        raise OutputDirError(f"{out} is a file, not a folder; choose a folder for the dataset")


def make_output_folder(out: Path) -> None:
    refuse_file_output(out)
    out.mkdir(parents=True, exist_ok=True)


def clear_output(out: Path, dataset_name: str) -> None:
    """--overwrite: delete everything a previous conversion named `dataset_name` left in `out`."""
    if not out.is_dir():
        return
    for entry in out.iterdir():
        if _ours(entry.name, dataset_name) and entry.name != LOCK_NAME:  # held by this run
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()


def sweep_temporaries(out: Path, dataset_name: str) -> None:
    """Temporary shard/manifest files of a killed run (their final names are rewritten anyway)."""
    for entry in out.iterdir():
        if entry.name.startswith(".") and ".tmp-" in entry.name and _ours(entry.name, dataset_name):
            entry.unlink(missing_ok=True)


def foreign_entries(out: Path, dataset_name: str) -> list[str]:
    if not out.is_dir():
        return []
    return sorted(e.name for e in out.iterdir() if not _ours(e.name, dataset_name))


def finished_manifest(out: Path) -> Manifest | None:
    if not (out / MANIFEST_NAME).exists():
        return None
    try:
        return load_manifest(out)
    except ShardtokError:
        return None


def remove_stale_shards(out: Path, manifest: Manifest) -> None:
    """Shards of an earlier, longer attempt that the new manifest does not list."""
    listed = {s.file for s in manifest.shards}
    for entry in out.iterdir():
        if (
            re.fullmatch(rf"{re.escape(manifest.name)}-\d{{6}}\.tar", entry.name)
            and entry.name not in listed
        ):
            entry.unlink()


def prepare_output(
    out: Path, dataset_name: str, plan: dict, settings: dict, overwrite: bool
) -> tuple[WorkDir, Manifest | None]:
    """Get `out` ready; returns the work folder and, when this job is already done, its manifest."""
    workdir = WorkDir(out)
    if overwrite:
        clear_output(out, dataset_name)
    out.mkdir(parents=True, exist_ok=True)
    workdir.sweep_trash()
    sweep_temporaries(out, dataset_name)
    existing_plan = workdir.read_plan() if workdir.exists() else None
    if existing_plan == plan:
        workdir.sweep_temporaries()
        return workdir, None
    if existing_plan is not None:
        # Typically: a run stopped at a bad record, the input was fixed, and this is the rerun.
        # The unfinished work is only our own cache, so it is discarded rather than refused.
        print(
            f"note: {out} held unfinished work of other inputs or options; starting over",
            file=sys.stderr,
        )
        workdir.start(plan)
        return workdir, None
    manifest = finished_manifest(out)
    if manifest is not None:
        if manifest.extra.get("convert") == settings:
            return workdir, manifest
        raise OutputDirError(
            f"{out} already holds a dataset converted from other inputs or options "
            "(pass --overwrite to replace it, or choose another --output)"
        )
    foreign = foreign_entries(out, dataset_name)
    if foreign:
        shown = ", ".join(foreign[:5]) + (" ..." if len(foreign) > 5 else "")
        raise OutputDirError(
            f"output folder {out} is not empty ({shown}); choose an empty or new folder"
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
    """rejects.jsonl under --on-bad-record skip: streamed to a temporary file, renamed at the end."""

    def __init__(self, out: Path):
        self.path = out / REJECTS_NAME
        self._tmp = self.path.with_name(f".{REJECTS_NAME}.tmp-{os.getpid()}")
        self._file = open(self._tmp, "wb")  # noqa: SIM115 (closed in commit/discard)

    def write(self, file: str, line: int, reason: str, detail: str) -> None:
        record = {"file": file, "line": line, "reason": reason, "detail": detail}
        self._file.write(json.dumps(record, ensure_ascii=False).encode("utf-8") + b"\n")

    def commit(self) -> Path:
        self._file.close()
        os.replace(self._tmp, self.path)
        return self.path

    def discard(self) -> None:
        # Flushing fails on a full disk: the error being reported already says so.
        with contextlib.suppress(OSError):
            self._file.close()
        self._tmp.unlink(missing_ok=True)
