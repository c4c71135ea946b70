"""One conversion per output folder at a time, and OS errors as one line naming the path.

Two converts into one folder would interleave their work units and shard renames; the second
one is refused at once (no waiting) with the first one's pid. The lock is an flock on
``OUT/.shardtok-lock``, so it vanishes with its holder, even one killed with SIGKILL: a stale
file never blocks a rerun. Where flock does not exist (Windows), there is no lock.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

from shardtok.errors import ShardtokError

LOCK_NAME = ".shardtok-lock"

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None


class OutputInUseError(ShardtokError):
    """Another process is converting into the same output folder."""


class OutputIOError(ShardtokError):
    """The OS refused a read or write (disk full, permissions...): the path and the reason."""

    def __init__(self, path: str, reason: str):
        self.path, self.reason = str(path), reason
        super().__init__(f"{self.path}: {reason}")

    def __reduce__(self):
        return (type(self), (self.path, self.reason))


_RERUN = "; finished work units are kept, so running the same command again resumes"
_HINTS = {
    errno.ENOSPC: "free some space" + _RERUN,
    errno.EDQUOT: "free some space or raise the quota" + _RERUN,
    errno.EFBIG: "a file grew past the size limit (ulimit -f)" + _RERUN,
}


def os_error(exc: OSError, folder: Path) -> OutputIOError:
    """`exc` as one line. Writes through a file object carry no file name: name the folder."""
    where = exc.filename if exc.filename is not None else f"writing in {folder}"
    reason = exc.strerror or str(exc)
    hint = _HINTS.get(exc.errno)
    return OutputIOError(str(where), f"{reason} ({hint})" if hint else reason)


class OutputLock:
    """Held for the whole conversion; released (and its file removed) on exit."""

    def __init__(self, out: Path):
        self.path = Path(out) / LOCK_NAME
        self._fd: int | None = None

    def __enter__(self) -> OutputLock:
        if fcntl is None:
            return self
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 200).decode("utf-8", "replace").strip() or "pid unknown"
                os.close(fd)
                raise OutputInUseError(
                    f"output folder {self.path.parent} is in use by another conversion "
                    f"({holder}); wait for it to finish, or choose another --output"
                ) from None
            except BaseException:
                os.close(fd)
                raise
            # The holder we waited behind may have removed the file after we opened it: a lock
            # on a removed file excludes no one, so lock the file now at the path instead.
            try:
                current = os.stat(self.path).st_ino
            except FileNotFoundError:
                current = None
            if current == os.fstat(fd).st_ino:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode())
        self._fd = fd
        return self

    def __exit__(self, *exc_info) -> None:
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)  # while still held, so no one locks a removed file
        finally:
            os.close(self._fd)
            self._fd = None
