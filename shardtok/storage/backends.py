"""fsspec filesystems, one per process and configuration, and how to read ranges from them.

Each remote read is a single request for ``[start, end)``. For S3 (s3fs) and HTTP (fsspec's
aiohttp session) the body is collected chunk by chunk as it arrives, so when a
connection dies halfway the bytes already received are kept and the retry asks only for the
rest. Other fsspec protocols (``gs://`` through gcsfs, ...) read each range whole with
``cat_file``; the retry loop above is the same.

The clients' own retries are switched off (s3fs ``retries``, botocore ``total_max_attempts``)
so that ``RetryPolicy`` is the one place that decides; their timeouts are set from it too.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from shardtok.storage.location import protocol_of
from shardtok.storage.retry import FatalStorageIssue, RetryPolicy, TruncatedBody

CHUNK = 1 << 20  # largest piece read from a response body at once


@dataclass(frozen=True)
class ObjectInfo:
    size: int
    etag: str | None  # validator used for If-Match and as part of the cache key


class Progress:
    """The body chunks the current request delivered; kept when the request fails. Also when
    the first one arrived (``time.monotonic()``): with the request's start, its latency."""

    __slots__ = ("chunks", "done", "first_at", "info")

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.done = 0
        self.first_at: float | None = None
        self.info: ObjectInfo | None = None  # a GET of the head: what its headers said

    def add(self, chunk: bytes) -> None:
        if self.first_at is None:
            self.first_at = time.monotonic()
        self.chunks.append(chunk)
        self.done += len(chunk)


def _with_defaults(options: dict, protocol: str, policy: RetryPolicy) -> dict:
    options = dict(options)
    if protocol in ("s3", "s3a"):
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("connect_timeout", policy.timeout)
        config.setdefault("read_timeout", policy.timeout)
        config["retries"] = {"total_max_attempts": 1}
        # Each stream keeps several ranged GETs in flight (readahead): botocore's default pool
        # of 10 connections would queue them behind one another.
        config.setdefault("max_pool_connections", 64)
        options["config_kwargs"] = config
    elif protocol in ("http", "https"):
        import aiohttp

        client = dict(options.get("client_kwargs") or {})
        client.setdefault(
            "timeout",
            aiohttp.ClientTimeout(
                total=None, sock_connect=policy.timeout, sock_read=policy.timeout
            ),
        )
        options["client_kwargs"] = client
    options["skip_instance_cache"] = True
    return options


def client_options(
    protocol: str, *, max_attempts: int | None = None, timeout: float | None = None
) -> dict:
    """``storage_options`` that give an fsspec client of `protocol` these attempts and this
    timeout in its own terms, for clients that retry by themselves (conversion's inputs and
    output folder, which have no RetryPolicy loop): s3 through botocore's ``retries`` and
    connect/read timeouts, http(s) through aiohttp's connect/read timeouts (fsspec's HTTP
    client makes each request once). Other protocols: none (their clients keep their own)."""
    if protocol in ("s3", "s3a"):
        config: dict[str, Any] = {}
        if max_attempts is not None:
            config["retries"] = {"total_max_attempts": max_attempts, "mode": "standard"}
        if timeout is not None:
            config["connect_timeout"] = config["read_timeout"] = timeout
        return {"config_kwargs": config} if config else {}
    if protocol in ("http", "https") and timeout is not None:
        import aiohttp

        limits = aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout)
        return {"client_kwargs": {"timeout": limits}}
    return {}


_CONFIG_ENV = ("AWS_", "GOOGLE_", "GCS", "FSSPEC_")
_filesystems: dict[tuple, Any] = {}
_filesystems_lock = threading.Lock()


def filesystem(protocol: str, storage_options: dict | None, policy: RetryPolicy):
    """The fsspec filesystem for these options, shared by the threads of one process.

    Keyed by process id: an fsspec filesystem made before a fork holds the parent's event loop
    and connections, so a DataLoader worker must build its own.
    """
    import fsspec
    from fsspec.utils import tokenize

    # The environment is part of the configuration (AWS_ENDPOINT_URL, AWS_PROFILE, ...).
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith(_CONFIG_ENV))
    key = (os.getpid(), protocol, tokenize(storage_options or {}, env), policy.timeout)
    with _filesystems_lock:
        fs = _filesystems.get(key)
        if fs is None:
            try:
                cls = fsspec.get_filesystem_class(protocol)
            except (ImportError, ValueError) as exc:  # unknown protocol or backend missing
                raise FatalStorageIssue(f"no fsspec backend for {protocol}://: {exc}") from None
            fs = cls(**_with_defaults(storage_options or {}, protocol, policy))
            if protocol in ("s3", "s3a"):
                fs.retries = 1  # s3fs's own retry loop: one attempt, ours does the rest
            _filesystems[key] = fs
        return fs


class Backend:
    """Reads ``[start, end)`` of one object through an fsspec filesystem."""

    def __init__(self, url: str, storage_options: dict | None, policy: RetryPolicy):

        self.url = url
        self.protocol = protocol_of(url)
        self.storage_options = storage_options
        self.policy = policy

    @property
    def fs(self):
        return filesystem(self.protocol, self.storage_options, self.policy)

    def head(self) -> ObjectInfo:
        fs = self.fs
        if self.protocol in ("s3", "s3a"):
            return _sync(fs, _s3_head(fs, self.url, self.policy.timeout))
        if self.protocol in ("http", "https"):
            return _sync(fs, _http_head(fs, self.url, self.policy.timeout))
        info = fs.info(fs._strip_protocol(self.url))
        if info.get("type", "file") != "file" or info.get("size") is None:
            raise FileNotFoundError(f"not a file: {info.get('type')}")
        etag = next(
            (str(info[k]) for k in ("ETag", "etag", "generation", "mtime") if info.get(k)), None
        )
        return ObjectInfo(int(info["size"]), etag)

    def read_head(self, length: int, progress: Progress) -> ObjectInfo | None:
        """Size and ETag from a GET of the object's first `length` bytes (into ``progress``):
        one round trip where a HEAD and then a GET would take two. None where that cannot be
        had (an empty object answers 416; a protocol without ranged GETs of ours): ask ``head``.
        A body cut short raises ``TruncatedBody`` with ``progress.info`` already set, so the
        caller can ask for the rest of the head by an ordinary ranged read."""
        fs = self.fs
        if self.protocol in ("s3", "s3a"):
            info = _sync(fs, _s3_read_head(fs, self.url, length, progress, self.policy.timeout))
        elif self.protocol in ("http", "https"):
            info = _sync(fs, _http_read_head(fs, self.url, length, progress, self.policy.timeout))
        else:
            return None
        if info is not None and progress.done < min(length, info.size):
            raise TruncatedBody(progress.done, min(length, info.size))
        return info

    def read(self, start: int, length: int, progress: Progress, etag: str | None) -> None:
        """Deliver bytes ``[start, start + length)`` into ``progress`` as they arrive.

        Ends early only by raising (``TruncatedBody`` for a short body); ``progress`` then holds
        the bytes that did arrive, so the caller can ask for the rest.
        """
        fs = self.fs
        if self.protocol in ("s3", "s3a"):
            _sync(fs, _s3_read(fs, self.url, start, length, progress, etag, self.policy.timeout))
        elif self.protocol in ("http", "https"):
            _sync(fs, _http_read(fs, self.url, start, length, progress, etag, self.policy.timeout))
        else:
            data = fs.cat_file(fs._strip_protocol(self.url), start=start, end=start + length)
            if len(data) > length:
                raise FatalStorageIssue(f"server sent {len(data)} bytes for {length} asked")
            progress.add(bytes(data))
        if progress.done < length:
            raise TruncatedBody(progress.done, length)


def _sync(fs, coro):
    """Run a coroutine on the filesystem's event loop thread and wait for it."""
    import fsspec.asyn

    async def run():
        return await coro

    return fsspec.asyn.sync(fs.loop, run)


async def _drain(read, length: int, progress: Progress) -> None:
    """Collect body chunks as they arrive (kept as they come: no copy until the final join).

    No timer per chunk (it would cost a task each): the client's socket read timeout, set from
    ``RetryPolicy.timeout`` (aiohttp ``sock_read``, botocore ``read_timeout``), ends a stall.
    """
    while progress.done < length:
        chunk = await read(min(CHUNK, length - progress.done))
        if not chunk:
            return
        progress.add(chunk)


# -- S3 through s3fs / aiobotocore ----------------------------------------------------------


def _s3_location(fs, url: str) -> dict:
    bucket, key, version = fs.split_path(url)
    loc: dict[str, Any] = {"Bucket": bucket, "Key": key}
    if version:
        loc["VersionId"] = version
    return loc


async def _s3_head(fs, url: str, timeout: float) -> ObjectInfo:
    resp = await asyncio.wait_for(fs._call_s3("head_object", **_s3_location(fs, url)), timeout)
    return ObjectInfo(int(resp["ContentLength"]), resp.get("ETag"))


async def _s3_read(fs, url, start, length, progress, etag, timeout) -> None:
    kwargs = _s3_location(fs, url)
    kwargs["Range"] = f"bytes={start}-{start + length - 1}"
    if etag:
        kwargs["IfMatch"] = etag
    resp = await asyncio.wait_for(fs._call_s3("get_object", **kwargs), timeout)
    body = resp["Body"]
    try:
        _check_content_range(resp.get("ContentRange"), start, length, url)
        await _drain(body.read, length, progress)
    finally:
        body.close()


async def _s3_read_head(fs, url, length, progress, timeout) -> ObjectInfo | None:
    kwargs = _s3_location(fs, url)
    kwargs["Range"] = f"bytes=0-{length - 1}"
    try:
        resp = await asyncio.wait_for(fs._call_s3("get_object", **kwargs), timeout)
    except Exception as exc:
        if _status_in_chain(exc) == 416:  # an empty object has no byte 0
            return None
        raise
    body = resp["Body"]
    try:
        size = _total_of(resp.get("ContentRange"), resp.get("ContentLength"), url)
        progress.info = ObjectInfo(size, resp.get("ETag"))
        await _drain(body.read, min(length, size), progress)
    finally:
        body.close()
    return progress.info


def _status_in_chain(exc: BaseException) -> int | None:
    from shardtok.storage.retry import exception_chain, status_of

    return next((s for s in map(status_of, exception_chain(exc)) if s is not None), None)


def _total_of(content_range: str | None, content_length, url: str) -> int:
    """The object's size from a ranged GET's answer: ``Content-Range: bytes a-b/TOTAL``, or a
    whole-object answer's ``Content-Length``."""
    if content_range is None:
        if content_length is None:
            raise FatalStorageIssue("server does not report the size (no Content-Length)")
        return int(content_length)
    unit, _, rest = content_range.partition(" ")
    first, _, total = rest.partition("/")
    if unit != "bytes" or not first.startswith("0-") or not total.isdigit():
        raise FatalStorageIssue(f"server answered range {content_range!r} for bytes=0-")
    return int(total)


# -- HTTP(S) through fsspec's aiohttp session -----------------------------------------------


def _request_kwargs(fs, extra_headers: dict) -> dict:
    kwargs = dict(fs.kwargs)
    headers = dict(kwargs.pop("headers", None) or {})
    headers.update(extra_headers)
    kwargs["headers"] = headers
    return kwargs


def _raise_for_status(response, url: str) -> None:
    if response.status == 404:
        raise FileNotFoundError(url)
    response.raise_for_status()


MAX_REDIRECTS = 10
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})


async def _http_send(fs, method: str, url: str, kwargs: dict, timeout: float):
    """The response to ``method url``, following redirects within the URL's origin only.

    aiohttp drops only ``Authorization`` when it follows a redirect to another origin; the
    other headers and cookies from ``storage_options`` (API keys, session headers) would go
    along. So redirects are followed here, and one to another origin (scheme, host, port) is
    refused before any request reaches it: a dataset's options go to its own origin only.
    """
    import yarl

    session = await fs.set_session()
    kwargs = dict(kwargs, allow_redirects=False)
    start = target = fs.encode_url(url)
    for _ in range(MAX_REDIRECTS + 1):
        response = await asyncio.wait_for(session.request(method, target, **kwargs), timeout)
        if response.status not in _REDIRECT_STATUSES:
            return response
        location = response.headers.get("Location")
        response.release()
        if not location:
            raise FatalStorageIssue(f"HTTP {response.status} redirect without a Location")
        try:
            target = target.join(yarl.URL(location))
            same = target.absolute and target.origin() == start.origin()
        except ValueError:
            same = False
        if not same:
            # Only the origin is named: a redirect's path and query may carry a signature.
            where = f"{target.scheme}://{target.host}:{target.port}" if target.absolute else "?"
            raise FatalStorageIssue(
                f"redirected to another origin ({where}): refused, since a dataset's requests "
                "and credentials go to its own origin only; use the final URL as the location"
            )
    raise FatalStorageIssue(f"more than {MAX_REDIRECTS} redirects")


async def _http_head(fs, url: str, timeout: float) -> ObjectInfo:
    kwargs = _request_kwargs(fs, {"Accept-Encoding": "identity"})
    response = await _http_send(fs, "HEAD", url, kwargs, timeout)
    async with response:
        _raise_for_status(response, url)
        headers = response.headers
        if headers.get("Content-Encoding", "identity") not in ("identity", ""):
            raise FatalStorageIssue("server compresses the response; size unknown")
        if "Content-Length" not in headers:
            raise FatalStorageIssue("server does not report the size (no Content-Length)")
        return ObjectInfo(int(headers["Content-Length"]), headers.get("ETag"))


async def _http_read(fs, url, start, length, progress, etag, timeout) -> None:
    headers = {"Range": f"bytes={start}-{start + length - 1}", "Accept-Encoding": "identity"}
    if etag and not etag.startswith("W/"):  # If-Match needs a strong validator
        headers["If-Match"] = etag
    kwargs = _request_kwargs(fs, headers)
    response = await _http_send(fs, "GET", url, kwargs, timeout)
    async with response:
        _raise_for_status(response, url)
        if response.status != 206 and not (response.status == 200 and start == 0):
            raise FatalStorageIssue(
                f"server ignored the Range request (HTTP {response.status}, expected 206)"
            )
        _check_content_range(response.headers.get("Content-Range"), start, length, url)
        await _drain(response.content.read, length, progress)


async def _http_read_head(fs, url, length, progress, timeout) -> ObjectInfo | None:
    headers = {"Range": f"bytes=0-{length - 1}", "Accept-Encoding": "identity"}
    kwargs = _request_kwargs(fs, headers)
    response = await _http_send(fs, "GET", url, kwargs, timeout)
    async with response:
        if response.status == 416:  # an empty object has no byte 0
            return None
        _raise_for_status(response, url)
        if response.status not in (200, 206):
            raise FatalStorageIssue(f"unexpected HTTP {response.status} to a ranged GET")
        if response.headers.get("Content-Encoding", "identity") not in ("identity", ""):
            raise FatalStorageIssue("server compresses the response; size unknown")
        content_range = response.headers.get("Content-Range") if response.status == 206 else None
        size = _total_of(content_range, response.headers.get("Content-Length"), url)
        progress.info = ObjectInfo(size, response.headers.get("ETag"))
        await _drain(response.content.read, min(length, size), progress)
        return progress.info


def _check_content_range(value: str | None, start: int, length: int, url: str) -> None:
    """A server that answers a different range than asked would splice wrong bytes in."""
    if value is None:
        if start != 0:  # a whole-object answer would put byte 0 where byte `start` belongs
            raise FatalStorageIssue(f"server ignored the Range request for bytes={start}-")
        return
    unit, _, rest = value.partition(" ")
    first, _, last = rest.partition("/")[0].partition("-")
    if unit != "bytes" or not first.isdigit() or int(first) != start:
        raise FatalStorageIssue(f"server answered range {value!r} for bytes={start}-")
    if last.isdigit() and int(last) != start + length - 1:
        raise FatalStorageIssue(f"server answered range {value!r} for {length} bytes at {start}")
