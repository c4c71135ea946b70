"""A folder that files are written to whole: a local directory or an object-store prefix.

Conversion writes its work units, shards and manifest through this. The rule that makes it safe
on both is the same: a file appears whole or not at all, and a marker written last says that a
group of files is complete. Locally a file is written under a temporary name unique to this
process (pid and a random part, since two machines on a shared file system may share pids) and
renamed. On an object store nothing is ever renamed (S3 has no rename; a copy and delete would
double the traffic and still not be atomic): each file is one plain PUT, which S3 and its kin
make visible whole or not at all. Readers therefore never see a half-written file, and two
writers of the same deterministic file (a requeued task and its zombie) only ever replace it
with the same bytes.

A member name is one path component (no separator, not ``.`` or ``..``), so a name taken from a
plan never reaches another folder or host. Unlike dataset members, names may start with ``.``:
the work folder and temporary files are hidden on purpose.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import sys
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path

from shardtok.storage.endpoints import contact
from shardtok.storage.location import Location, LocationError, join_url

_BLOCK = 4 << 20
SCRATCH_PREFIX = ".scratch-"  # scratch()'s private folders, inside a local folder


_forking: list = []  # the parent's fsspec clients while it forks
_inherited: list = []  # a forked child's copies of its parent's clients, kept for good


def _hold_clients() -> None:
    spec = sys.modules.get("fsspec.spec")
    if spec is None:
        return
    pending = [spec.AbstractFileSystem]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        cache = cls.__dict__.get("_cache")
        if cache:
            _forking.extend(cache.values())


def _keep_inherited_clients() -> None:
    _inherited.extend(_forking)
    _forking.clear()


if hasattr(os, "register_at_fork"):
    # fsspec empties its client cache in a forked child; a dropped s3fs client's finalizer
    # then closes its connections through the parent's event loop, whose epoll set the child
    # shares, and the parent's pooled connections go deaf (its next request waits out a read
    # timeout). So the child keeps its copies alive, unused.
    os.register_at_fork(
        before=_hold_clients,
        after_in_parent=_forking.clear,
        after_in_child=_keep_inherited_clients,
    )


def temporary_name(name: str) -> str:
    """A hidden name for `name` that no other process, here or on another host, will pick."""
    return f".{name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"


class Folder:
    """Files directly inside one local directory or object-store prefix.

    `storage_options` go to fsspec for a remote folder (s3fs ``key``/``secret``/
    ``endpoint_url``...); without them the backend's standard configuration applies.
    """

    def __init__(self, where: str | os.PathLike | Location, storage_options: dict | None = None):
        self.location = Location.of(where)
        self.storage_options = dict(storage_options or {})
        self._fs = None

    @property
    def is_local(self) -> bool:
        return self.location.is_local

    @property
    def display(self) -> str:
        return self.location.display

    def __repr__(self) -> str:
        return f"Folder({self.display!r})"

    def __reduce__(self):
        # Sent to worker processes and engine tasks: the fsspec client is rebuilt there.
        return (type(self), (self.location.url, self.storage_options))

    # -- names ------------------------------------------------------------------------------

    def _member(self, name: str) -> Location:
        if (
            not isinstance(name, str)
            or name in ("", ".", "..")
            or any(c in name for c in "/\\\0")
            or not name.isprintable()
        ):
            raise LocationError(self.display, None, f"refused member name {name!r}")
        if self.is_local:
            return Location(os.path.join(self.location.local_path, name))
        return Location(join_url(self.location.url, name))

    def url(self, name: str) -> str:
        """What to open for member `name` (a local path, or a URL with credentials kept)."""
        return str(self._member(name))

    def display_of(self, name: str) -> str:
        return self._member(name).display

    def sub(self, name: str) -> Folder:
        """The folder `name` inside this one."""
        return Folder(self._member(name), self.storage_options)

    @property
    def fs(self):
        if self._fs is None:
            import fsspec

            self._fs = fsspec.filesystem(self.location.protocol, **self.storage_options)
        return self._fs

    def _remote_path(self, name: str | None = None) -> str:
        url = self.location.url if name is None else self.url(name)
        return self.fs._strip_protocol(url)

    def _contact(self):
        # A store that refuses the very first request fails at once, named (see endpoints).
        return contact(self.location.url, self.storage_options)

    def _fresh(self, path: str) -> str:
        # fsspec clients are shared within a process and may keep a listing: another process's
        # writes since then would be invisible (a missing unit, a stale size or ETag).
        self.fs.invalidate_cache(path)
        return path

    # -- writing ----------------------------------------------------------------------------

    def make(self) -> None:
        """Create the folder (a no-op on object stores, where prefixes need no creating)."""
        if self.is_local:
            Path(self.location.local_path).mkdir(parents=True, exist_ok=True)

    def write_bytes(self, name: str, data: bytes | memoryview) -> None:
        if self.is_local:
            target = Path(self.url(name))
            tmp = target.with_name(temporary_name(target.name))
            try:
                with open(tmp, "wb") as out:
                    out.write(data)
                os.replace(tmp, target)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            return
        with self._contact():
            self.fs.pipe_file(self._remote_path(name), bytes(data))

    def put_file(self, name: str, local: str | os.PathLike) -> None:
        """Publish the local file `local` as member `name`; `local` is consumed (moved or
        deleted). Locally it is renamed into place, so it must live on the same file system:
        see :meth:`scratch`."""
        local = Path(local)
        if self.is_local:
            os.replace(local, self.url(name))
            return
        try:
            with self._contact():
                self.fs.put_file(str(local), self._remote_path(name))
        finally:
            local.unlink(missing_ok=True)

    @contextlib.contextmanager
    def scratch(self) -> Iterator[Path]:
        """A private local folder for files about to be published with :meth:`put_file`:
        inside this folder when local (so publishing is a rename), a temporary directory
        otherwise. Removed on exit with whatever was not published."""
        if self.is_local:
            self.make()
            path = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=self.location.local_path))
        else:
            path = Path(tempfile.mkdtemp(prefix="shardtok-"))
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def delete(self, name: str) -> None:
        """Remove member `name` (a file, or a folder with everything in it); missing is fine."""
        if self.is_local:
            path = Path(self.url(name))
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            return
        target = self._fresh(self._remote_path(name))
        with self._contact(), contextlib.suppress(FileNotFoundError):
            if not self.fs.isdir(target):
                self.fs.rm_file(target)
                return
            self.fs.rm(target, recursive=True)
            if self.location.protocol in ("s3", "s3a"):
                # Stores with real folders (SeaweedFS, MinIO) keep the emptied one listed until
                # its "name/" key is deleted; on S3 proper that key is absent and this a no-op.
                bucket, _, key = target.partition("/")
                with contextlib.suppress(Exception):
                    self.fs.call_s3("delete_object", Bucket=bucket, Key=key.rstrip("/") + "/")
            self._fresh(target)

    # -- reading ----------------------------------------------------------------------------

    def read_bytes(self, name: str) -> bytes:
        """The whole member; FileNotFoundError when it does not exist."""
        if self.is_local:
            return Path(self.url(name)).read_bytes()
        with self._contact():
            return self.fs.cat_file(self._remote_path(name))

    def read_range(self, name: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of member `name`."""
        if end <= start:
            return b""
        if self.is_local:
            with open(self.url(name), "rb") as f:
                f.seek(start)
                return f.read(end - start)
        with self._contact():
            return self.fs.cat_file(self._remote_path(name), start=start, end=end)

    def size(self, name: str) -> int | None:
        """The member's size in bytes, or None when it does not exist."""
        if self.is_local:
            try:
                return os.stat(self.url(name)).st_size
            except FileNotFoundError:
                return None
        try:
            with self._contact():
                return int(self.fs.size(self._fresh(self._remote_path(name))))
        except FileNotFoundError:
            return None

    def exists(self, name: str) -> bool:
        return self.size(name) is not None

    def crc32(self, name: str) -> int:
        """crc32 of the whole member, read in blocks."""
        crc = 0
        if self.is_local:
            with open(self.url(name), "rb") as f:
                while block := f.read(_BLOCK):
                    crc = zlib.crc32(block, crc)
            return crc
        path = self._fresh(self._remote_path(name))
        with self._contact(), self.fs.open(path, "rb", block_size=_BLOCK) as f:
            while block := f.read(_BLOCK):
                crc = zlib.crc32(block, crc)
        return crc

    def list(self) -> list[str]:
        """Names of the members directly inside (files and folders), sorted; [] when the
        folder does not exist. One listing request remotely (paged by the store)."""
        if self.is_local:
            try:
                return sorted(os.listdir(self.location.local_path))
            except FileNotFoundError:
                return []
        path = self._remote_path()
        try:
            with self._contact():
                entries = self.fs.ls(path, detail=False, refresh=True)
        except FileNotFoundError:
            return []
        finally:
            self._fresh(path)
        # A listing of an empty folder may name the folder itself (s3fs, on stores with real
        # folders): only what lies below it is a member.
        root = path.rstrip("/")
        names = (str(e).rstrip("/") for e in entries)
        return sorted(n.rsplit("/", 1)[-1] for n in names if n != root)

    @contextlib.contextmanager
    def local_file(self, name: str) -> Iterator[Path]:
        """Member `name` as a local file: itself when local, else a temporary download."""
        if self.is_local:
            yield Path(self.url(name))
            return
        with tempfile.TemporaryDirectory(prefix="shardtok-") as tmp:
            path = Path(tmp) / "copy"
            with self._contact():
                self.fs.get_file(self._remote_path(name), str(path))
            yield path
