"""Locations: the one place that tells local paths from URLs.

Accepted: plain paths (``/data/ds/shard-000.tar``, ``data/ds``), ``file://`` URLs (RFC 8089,
percent-escapes decoded, host empty or ``localhost``), and ``<protocol>://...`` for remote
stores (``s3``, ``gs``, ``http``, ``https`` and any other protocol fsspec knows). Everything
that needs to know "local or not", the OS path, a joined name or a printable form asks here,
so no caller keeps its own ``"://" in`` test.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")


def protocol_of(url: str | os.PathLike) -> str:
    """``"s3"`` for ``s3://b/k``, ``"file"`` for paths and ``file://`` URLs."""
    match = _SCHEME.match(os.fspath(url))
    return match.group(1).lower() if match else "file"


def is_local(url: str | os.PathLike) -> bool:
    return protocol_of(url) == "file"


def local_path(url: str | os.PathLike) -> str:
    """The OS path of a local path or ``file://`` URL."""
    url = os.fspath(url)
    if not _SCHEME.match(url):
        return url
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme.lower() != "file":
        raise ValueError(f"not a local path or file:// URL: {display_url(url)}")
    if parsed.netloc not in ("", "localhost"):
        raise ValueError(f"file:// URL names a remote host {parsed.netloc!r}: {url}")
    return urllib.parse.unquote(parsed.path)


def join_url(prefix: str | os.PathLike, name: str | os.PathLike) -> str:
    """``prefix`` + ``/`` + ``name`` for paths and URLs alike; ``name`` may hold ``/``.

    An absolute ``name`` (a URL or an absolute path) is returned as is. Nothing is quoted:
    fsspec backends encode keys themselves, so pass names as they are stored. A remote prefix
    with a query string is refused: a pre-signed URL signs one object, so no other name can be
    reached from it.
    """
    prefix, name = os.fspath(prefix), os.fspath(name)
    if _SCHEME.match(name) or (is_local(prefix) and os.path.isabs(name)):
        return name
    if "?" in prefix and not is_local(prefix):
        raise ValueError(
            f"cannot join a name onto a URL with a query string: {display_url(prefix)}"
        )
    if not prefix:
        return name
    if prefix.endswith("://"):
        return prefix + name.lstrip("/")
    return prefix.rstrip("/") + "/" + name.lstrip("/")


def display_url(url: str | os.PathLike) -> str:
    """The URL without user:password and without query values (which may hold signatures)."""
    url = os.fspath(url)
    if not _SCHEME.match(url):
        return url
    parsed = urllib.parse.urlsplit(url)
    netloc = parsed.netloc.rpartition("@")[2]
    query = parsed.query
    if query:
        keys = [part.partition("=")[0] for part in query.split("&")]
        query = "&".join(f"{k}=***" for k in keys)
    return urllib.parse.urlunsplit((parsed.scheme, netloc, parsed.path, query, parsed.fragment))


@dataclass(frozen=True)
class Location:
    """A local path or URL, parsed once. ``str()`` gives what to open (credentials included);
    ``display`` what to print.

    A local location (plain path or ``file://`` URL) holds its decoded OS path, and joining
    names onto it joins OS paths, so a name is never percent-decoded a second time.
    """

    url: str
    protocol: str = field(init=False)
    _path: str | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        url = os.fspath(self.url)
        object.__setattr__(self, "url", url)
        object.__setattr__(self, "protocol", protocol_of(url))
        object.__setattr__(self, "_path", local_path(url) if self.protocol == "file" else None)

    @classmethod
    def of(cls, value: str | os.PathLike | Location) -> Location:
        return value if isinstance(value, Location) else cls(os.fspath(value))

    @property
    def is_local(self) -> bool:
        return self._path is not None

    @property
    def local_path(self) -> str:
        """The OS path; ``ValueError`` for a remote location."""
        if self._path is None:
            raise ValueError(f"not a local path or file:// URL: {self.display}")
        return self._path

    @property
    def display(self) -> str:
        return self._path if self._path is not None else display_url(self.url)

    @property
    def name(self) -> str:
        """The last path component (``shard-000001.tar``)."""
        text = self._path if self._path is not None else urllib.parse.urlsplit(self.url).path
        return text.rstrip("/").rsplit("/", 1)[-1]

    def join(self, name: str | os.PathLike) -> Location:
        if self._path is not None:
            name = os.fspath(name)
            if _SCHEME.match(name):
                return Location(name)
            # Path joining, as the stream always did: "./ds/" and "ds" give the same names.
            return Location(str(Path(self._path) / name))
        return Location(join_url(self.url, name))

    def __str__(self) -> str:
        return self._path if self._path is not None else self.url

    def __fspath__(self) -> str:
        return self.local_path


__all__ = ["Location", "display_url", "is_local", "join_url", "local_path", "protocol_of"]
