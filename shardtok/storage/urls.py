"""URL handling: which backend a URL goes to, local paths, joining, and safe display.

Accepted: plain paths (``/data/ds/shard-000.tar``, ``data/ds``), ``file://`` URLs (RFC 8089,
percent-escapes decoded), and ``<protocol>://...`` for remote stores (``s3``, ``gs``, ``http``,
``https`` and any other protocol fsspec knows).
"""

from __future__ import annotations

import os
import re
import urllib.parse

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")


def protocol_of(url: str) -> str:
    """``"s3"`` for ``s3://b/k``, ``"file"`` for paths and ``file://`` URLs."""
    match = _SCHEME.match(str(url))
    return match.group(1).lower() if match else "file"


def is_local(url: str) -> bool:
    return protocol_of(url) == "file"


def local_path(url: str) -> str:
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


def join_url(prefix: str, name: str) -> str:
    """``prefix`` + ``/`` + ``name`` for paths and URLs alike; ``name`` may hold ``/``.

    An absolute ``name`` (a URL or an absolute path) is returned as is. Nothing is quoted:
    fsspec backends encode keys themselves, so pass names as they are stored.
    """
    prefix, name = os.fspath(prefix), os.fspath(name)
    if _SCHEME.match(name) or (is_local(prefix) and os.path.isabs(name)):
        return name
    if "?" in prefix and not is_local(prefix):
        raise ValueError(f"cannot join a name onto a URL with a query string: {prefix}")
    if not prefix:
        return name
    if prefix.endswith("://"):
        return prefix + name.lstrip("/")
    return prefix.rstrip("/") + "/" + name.lstrip("/")


def display_url(url: str) -> str:
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
