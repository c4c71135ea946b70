"""Endpoints this process has reached, and failing at once on one it never has.

A connection refused, or a host name that does not resolve, on the very first request to an
endpoint is a mistake in the configuration (a wrong port, a typo in a host name, a server that
was never started) far more often than an outage: retrying for minutes only hides it. So until
an endpoint has answered once in this process, those two failures end the read at once with a
one-line ``EndpointUnreachableError`` naming the endpoint. Once it has answered, the same
failure is a server restarting or a network hiccup, and is retried like any transient failure.

An endpoint is what a client's configuration points at: an HTTP(S) URL's origin (scheme, host,
port), and for object stores the protocol with its configured ``endpoint_url`` (empty when the
client's own configuration picks it, as botocore does from ``AWS_ENDPOINT_URL`` or a profile).
The set is per process; a forked worker inherits its parent's, a spawned one starts empty
but for the endpoints of the ``DatasetSource`` objects sent to it (they carry theirs).
A DNS answer of "try again" (``EAI_AGAIN``) and connect timeouts are not final and stay retried.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator

from shardtok.errors import StorageError
from shardtok.storage.location import display_url, origin_of, protocol_of
from shardtok.storage.retry import exception_chain

Endpoint = tuple

_reached: set[Endpoint] = set()
_lock = threading.Lock()
# getaddrinfo's "no such name" answers; EAI_AGAIN (a resolver that did not answer) may pass.
_NAME_NOT_FOUND = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}
_OBJECT_STORES = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}


class EndpointUnreachableError(StorageError, ConnectionError):
    """The first request to an endpoint found nothing there (refused, or no such host).

    Also a ``ConnectionError``, so code that catches the builtin still sees it."""


def endpoint_of(url: str | os.PathLike, storage_options: dict | None = None) -> Endpoint:
    """The endpoint requests for `url` with these options go to (see the module docstring)."""
    protocol = protocol_of(url)
    if protocol in ("http", "https"):
        return origin_of(url)
    return (protocol, _configured_endpoint(storage_options))


def _configured_endpoint(storage_options: dict | None) -> str:
    options = storage_options or {}
    client = options.get("client_kwargs") or {}
    endpoint = options.get("endpoint_url") or client.get("endpoint_url") or ""
    return display_url(str(endpoint)).rstrip("/")


def note_reached(endpoint: Endpoint) -> None:
    """Record that `endpoint` answered a request (any answer, even an error status)."""
    if endpoint not in _reached:  # the common case, without the lock: reads are cheap
        with _lock:
            _reached.add(endpoint)


def was_reached(endpoint: Endpoint) -> bool:
    return endpoint in _reached


def forget_reached() -> None:
    """Forget every endpoint (for tests that need a process's first request again)."""
    with _lock:
        _reached.clear()


def _what(exc: BaseException) -> str | None:
    """What `exc` says about the endpoint: "refused", "no such host", or None (neither)."""
    for link in exception_chain(exc):
        if isinstance(link, ConnectionRefusedError):
            return "refused"
        if isinstance(link, socket.gaierror) and link.errno in _NAME_NOT_FOUND:
            return "no such host"
    return None


def _connection_target(exc: BaseException) -> tuple[str, str] | None:
    """(scheme://host:port, host) of the connection that failed, when the client says."""
    for link in exception_chain(exc):
        host, port = getattr(link, "host", None), getattr(link, "port", None)
        if isinstance(host, str) and isinstance(port, int):  # aiohttp.ClientConnectorError
            key = getattr(link, "_conn_key", None)
            scheme = "https" if getattr(key, "is_ssl", False) else "http"
            shown = f"[{host}]" if ":" in host else host
            return f"{scheme}://{shown}:{port}", host
        kwargs = getattr(link, "kwargs", None)  # botocore.exceptions.EndpointConnectionError
        if isinstance(kwargs, dict) and isinstance(kwargs.get("endpoint_url"), str):
            scheme, host, port = origin_of(kwargs["endpoint_url"])
            return f"{scheme}://{host}" + (f":{port}" if port else ""), host
    return None


def describe(exc: BaseException, url: str | os.PathLike | None = None) -> str | None:
    """One line saying which endpoint could not be reached and what to check, when `exc` is a
    refused connection or an unknown host name; None otherwise. `url`: what was asked for
    (without it, botocore's errors are taken for S3 and others for HTTP)."""
    what = _what(exc)
    if what is None:
        return None
    if url is None:
        botocore = any(type(e).__module__.startswith("botocore") for e in exception_chain(exc))
        url = "s3://" if botocore else "http://"
    protocol = protocol_of(url)
    store = _OBJECT_STORES.get(protocol)
    target = _connection_target(exc)
    if target is not None:
        endpoint, host = target
    else:
        scheme, host, port = origin_of(url)
        endpoint = f"{scheme}://{host}" + (f":{port}" if port else "")
    subject = f"{store} endpoint {endpoint}" if store else endpoint
    if store == "s3":
        check = "check endpoint_url in storage_options, or AWS_ENDPOINT_URL / the AWS profile"
    elif store:
        check = "check the endpoint in storage_options"
    else:
        check = "check the URL's host and port"
    if what == "refused":
        return f"{subject} refused the connection (nothing listens there? {check})"
    return f"{subject}: no such host {host!r} (the name does not resolve; {check})"


def check_first_contact(exc: BaseException, url: str, endpoint: Endpoint) -> None:
    """Raise ``EndpointUnreachableError`` for `exc` when `endpoint` never answered in this
    process and `exc` says nothing is there; return otherwise (the caller retries or raises)."""
    if endpoint in _reached:
        return
    message = describe(exc, url)
    if message is not None:
        raise EndpointUnreachableError(display_url(url), None, message) from None


@contextlib.contextmanager
def contact(url: str | os.PathLike, storage_options: dict | None = None) -> Iterator[None]:
    """Around requests made through a client of our own choosing (fsspec calls): the endpoint
    counts as reached when the block finishes, or fails with an answer from the server (an
    error status, a missing key); a refusal before any answer fails at once, named."""
    url = os.fspath(url)
    endpoint = endpoint_of(url, storage_options)
    try:
        yield
    except Exception as exc:
        if _what(exc) is None:
            if _answered(exc):
                note_reached(endpoint)
            raise
        check_first_contact(exc, url, endpoint)
        raise
    note_reached(endpoint)


def _answered(exc: BaseException) -> bool:
    """Whether `exc` carries a server's answer (a status or an error code): then it was there."""
    if isinstance(exc, FileNotFoundError | PermissionError):
        return True
    for link in exception_chain(exc):
        if isinstance(getattr(link, "status", None), int):
            return True
        if isinstance(getattr(link, "response", None), dict):
            return True
    return False
