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
import unicodedata
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from shardtok.errors import StorageError
from shardtok.format.validate import is_plain_name

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
# Separators, drive/scheme colons, query and fragment marks, control characters: none belongs
# in one file name, and each could make a name reach outside its folder or origin.
_NOT_IN_NAME = re.compile(r"[/\\:?#\x00-\x1f\x7f\ufffd]")
NAME_MAX = 255  # bytes, as the file systems' NAME_MAX


class LocationError(StorageError, ValueError):
    """A path, URL or joined name that storage refuses to use (also a ``ValueError``)."""


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
        raise LocationError(display_url(url), None, "not a local path or file:// URL")
    if parsed.netloc not in ("", "localhost"):
        raise LocationError(display_url(url), None, "file:// URL names a remote host")
    return urllib.parse.unquote(parsed.path)


def join_url(prefix: str | os.PathLike, name: str | os.PathLike) -> str:
    """``prefix`` + ``/`` + ``name`` for paths and URLs alike; ``name`` may hold ``/``.

    For paths the caller trusts: ``name`` may hold ``/``, and an absolute ``name`` (a URL or
    an absolute path) is returned as is. Names read from a dataset go through
    ``Location.join``, which takes plain file names only. Nothing is quoted:
    fsspec backends encode keys themselves, so pass names as they are stored. A remote prefix
    with a query string is refused: a pre-signed URL signs one object, so no other name can be
    reached from it.
    """
    prefix, name = os.fspath(prefix), os.fspath(name)
    if _SCHEME.match(name) or (is_local(prefix) and os.path.isabs(name)):
        return name
    if "?" in prefix and not is_local(prefix):
        raise LocationError(
            display_url(prefix), None, "cannot join a name onto a URL with a query string"
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
    # Some services carry tokens in the fragment too.
    fragment = "***" if parsed.fragment else ""
    return urllib.parse.urlunsplit((parsed.scheme, netloc, parsed.path, query, fragment))


def origin_of(url: str | os.PathLike) -> tuple[str, str, int | None]:
    """(scheme, host, port) of a URL, default ports filled in; ``("file", "", None)`` locally.

    Credentials and options given for a dataset go to this origin only."""
    url = os.fspath(url)
    if is_local(url):
        return ("file", "", None)
    parsed = urllib.parse.urlsplit(url)
    scheme = parsed.scheme.lower()
    try:
        port = parsed.port
    except ValueError:
        port = None
    if port is None:
        port = {"http": 80, "https": 443}.get(scheme)
    return (scheme, (parsed.hostname or "").lower(), port)


def name_problem(name: object) -> str | None:
    """Why ``name`` is not a plain file name (None when it is one).

    Plain: one path component, not starting with ``.``, without separators, ``:``, ``?``,
    ``#`` or control characters, also after percent-decoding (``%2f``, ``%252f``) and
    Unicode compatibility folding (a fullwidth ``／``), at most ``NAME_MAX`` bytes. What a
    server or file system might decode or fold is checked in its decoded form.
    """
    if not isinstance(name, str):
        return "not a string"
    if is_plain_name(name):  # the manifest's own rule: every name a shardtok writer makes
        return None
    if not name:
        return "empty"
    decoded = name
    for _ in range(4):
        once = urllib.parse.unquote(decoded, errors="replace")
        if once == decoded:
            break
        decoded = once
    else:
        return "percent-escapes nested too deep"
    if not decoded.isascii():
        decoded = unicodedata.normalize("NFKC", decoded)
    if len(name.encode("utf-8", "replace")) > NAME_MAX:
        return f"longer than {NAME_MAX} bytes"
    if decoded.startswith(".") or name.startswith("."):
        return "starts with '.'"
    if _NOT_IN_NAME.search(decoded) or _NOT_IN_NAME.search(name):
        return "holds a path separator, ':', '?', '#' or a control character"
    return None


def _shown_name(name: object) -> str:
    text = repr(name)
    return text if len(text) <= 80 else text[:77] + "..."


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
            raise LocationError(self.display, None, "not a local path or file:// URL")
        return self._path

    @property
    def display(self) -> str:
        return self._path if self._path is not None else display_url(self.url)

    @property
    def name(self) -> str:
        """The last path component (``shard-000001.tar``)."""
        text = self._path if self._path is not None else urllib.parse.urlsplit(self.url).path
        return text.rstrip("/").rsplit("/", 1)[-1]

    def join(self, name: str) -> Location:
        """File ``name`` inside this location; ``name`` must be a plain file name.

        Names come from manifests, which may come from someone else: anything that could
        reach another folder, another host or (from a remote dataset) a local file is refused
        with a ``LocationError`` naming this location, so the result always has this
        location's origin and folder.
        """
        problem = name_problem(name)
        if problem is not None:
            raise LocationError(
                self.display,
                None,
                f"refused file name {_shown_name(name)} ({problem}): only plain file names "
                "inside the dataset's own location are read",
            )
        if self._path is not None:
            # Path joining, as the stream always did: "./ds/" and "ds" give the same names.
            return Location(str(Path(self._path) / name))
        return Location(join_url(self.url, name))

    def __str__(self) -> str:
        return self._path if self._path is not None else self.url

    def __fspath__(self) -> str:
        return self.local_path


__all__ = [
    "Location",
    "LocationError",
    "display_url",
    "is_local",
    "join_url",
    "local_path",
    "name_problem",
    "origin_of",
    "protocol_of",
]
