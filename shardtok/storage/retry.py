"""How reads are retried: the policy, which failures are worth retrying, and secret scrubbing.

A failure is either *fatal* (the object is missing, access is denied, the request is wrong:
asking again cannot help, so we fail at once) or *transient* (connection reset, timeout, 5xx,
throttling, a body shorter than asked for: we wait and ask again for the missing bytes only).
"""

from __future__ import annotations

import asyncio
import errno
import os
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass

from shardtok.storage.location import display_url

MIN_READ_AHEAD = 64 << 10


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff for one read.

    ``max_attempts`` counts requests for one byte range (the first one included); a retry asks
    only for the bytes not yet received. The n-th wait is ``initial_delay * multiplier**(n-1)``
    capped at ``max_delay``, randomised by ``±jitter`` so that many workers do not retry in step.
    ``timeout`` is how long a request may go without delivering a byte (connect, headers or body)
    before it is abandoned and retried. The defaults ride out about two minutes of outage.

    ``read_ahead_bytes`` bounds the memory of one sequential stream of a remote object: the bytes
    it has requested and not yet handed to its reader (the block being read included). Within
    it, how far a stream reads ahead follows the link's measured latency and bandwidth
    (``readahead_plan``). It lives here because this policy is what reaches every remote read,
    from the library and from the command line alike.
    """

    max_attempts: int = 10
    initial_delay: float = 0.5
    max_delay: float = 30.0
    multiplier: float = 2.0
    timeout: float = 60.0
    jitter: float = 0.2
    read_ahead_bytes: int = 64 << 20

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.initial_delay < 0 or self.max_delay < 0 or self.multiplier < 1:
            raise ValueError("delays must be >= 0 and multiplier >= 1")
        if self.timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {self.timeout}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter}")
        if self.read_ahead_bytes < MIN_READ_AHEAD:
            raise ValueError(
                f"read_ahead_bytes must be >= {MIN_READ_AHEAD} (64 KiB), got {self.read_ahead_bytes}"
            )

    def delays(self) -> Iterator[float]:
        """The waits before retry 1, 2, ... (endless; the caller counts attempts)."""
        delay = self.initial_delay
        rng = random.Random()  # timing only: never affects which bytes are returned
        while True:
            yield min(delay, self.max_delay) * (1 + self.jitter * (2 * rng.random() - 1))
            delay = min(delay * self.multiplier, self.max_delay)


class TruncatedBody(OSError):
    """The server ended a response before the requested range was complete."""

    def __init__(self, received: int, expected: int):
        super().__init__(
            errno.EIO, f"response ended after {received} of {expected} requested bytes"
        )


class FatalStorageIssue(Exception):
    """A condition our own checks found that no retry can fix (bad Range support, ...)."""


_STATUS_REASONS = {
    401: "access denied (missing or invalid credentials)",
    403: "access denied (missing or invalid credentials, or no permission)",
    404: "not found",
    412: "the object changed while it was being read (ETag no longer matches)",
    416: "requested range not satisfiable",
}
_RETRYABLE_4XX = {408, 425, 429}


def status_of(exc: BaseException) -> int | None:
    status = getattr(exc, "status", None)  # aiohttp.ClientResponseError
    if isinstance(status, int):
        return status
    response = getattr(exc, "response", None)  # botocore ClientError
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(status, int):
            return status
        code = response.get("Error", {}).get("Code")
        if isinstance(code, str) and code.isdigit():
            return int(code)
    return None


def exception_chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and what caused it, each once: causes and contexts, and the ``os_error`` an
    aiohttp connection error wraps (the refusal itself, for ``endpoints``)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        nested = getattr(current, "os_error", None)  # aiohttp.ClientConnectorError
        if isinstance(nested, BaseException) and id(nested) not in seen:
            seen.add(id(nested))
            yield nested
        current = current.__cause__ or current.__context__


def _transient_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [OSError, asyncio.TimeoutError, TimeoutError]
    try:
        import aiohttp

        types.append(aiohttp.ClientError)
    except ImportError:
        pass
    try:
        import botocore.exceptions

        types += [botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError]
    except ImportError:
        pass
    try:
        from fsspec.exceptions import FSTimeoutError

        types.append(FSTimeoutError)
    except ImportError:
        pass
    return tuple(types)


def _timeout_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [asyncio.TimeoutError, TimeoutError]
    try:
        from fsspec.exceptions import FSTimeoutError

        types.append(FSTimeoutError)
    except ImportError:
        pass
    return tuple(types)


def _configuration_errors() -> dict[str, str]:
    """Client-side failures no retry can fix, by exception class name (botocore's)."""
    return {
        "NoCredentialsError": "access denied (no credentials found)",
        "PartialCredentialsError": "access denied (incomplete credentials)",
        "ProfileNotFound": "configuration error (AWS profile not found)",
        "NoRegionError": "configuration error (no region configured)",
        "ParamValidationError": "configuration error (invalid request parameters)",
    }


def classify(exc: BaseException) -> str | None:
    """``"fatal: <reason>"``, ``"transient"``, or None for errors that are not I/O at all.

    None means a programming error (TypeError, ...): the caller lets it propagate unchanged.
    """
    if isinstance(exc, FatalStorageIssue):
        return f"fatal: {exc}"
    config_errors = _configuration_errors()
    for link in exception_chain(exc):
        for cls in type(link).__mro__:
            if cls.__name__ in config_errors and cls.__module__.startswith("botocore"):
                return "fatal: " + config_errors[cls.__name__]
    for link in exception_chain(exc):
        status = status_of(link)
        if status is not None:
            if status in _STATUS_REASONS:
                return "fatal: " + _STATUS_REASONS[status]
            if 400 <= status < 500 and status not in _RETRYABLE_4XX:
                return f"fatal: request rejected with HTTP {status}"
            return "transient"
    if isinstance(exc, FileNotFoundError):
        return "fatal: " + _STATUS_REASONS[404]
    if isinstance(exc, PermissionError):
        return "fatal: " + _STATUS_REASONS[403]
    if isinstance(exc, _transient_types()):
        return "transient"
    return None


# -- keeping secrets out of messages --------------------------------------------------------

_SECRET_KEY = re.compile(
    r"secret|token|password|passwd|credential|auth|signature|session|private|key", re.I
)
# URLs inside a client's message: their query values and user:password go, whatever they are
# (a signature quoted differently than the one we were given would not match as a secret).
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>]+")
_NOT_SECRET = {"endpoint_url", "region_name", "region", "key_id_type"}
_SECRET_ENV = (
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ACCESS_KEY_ID",
    "GOOGLE_SERVICE_ACCOUNT_KEY",
    "GCS_OAUTH_TOKEN",
)


def _collect(value: object, key: str, out: set[str]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _collect(v, str(k), out)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _collect(v, key, out)
    elif isinstance(value, str):
        if _SECRET_KEY.search(key) and key not in _NOT_SECRET and len(value) >= 4:
            out.add(value)
    elif value is not None and not isinstance(value, (int, float, bool)):
        # objects such as aiohttp.BasicAuth(login, password)
        for attr in ("password", "secret", "token"):
            secret = getattr(value, attr, None)
            if isinstance(secret, str) and len(secret) >= 4:
                out.add(secret)


class Redactor:
    """Replaces every credential we know of (from storage_options and the environment)."""

    def __init__(self, storage_options: dict | None):
        secrets: set[str] = set()
        _collect(storage_options or {}, "", secrets)
        for name in _SECRET_ENV:
            value = os.environ.get(name)
            if value and len(value) >= 4:
                secrets.add(value)
        # Longest first, so a secret containing another is replaced whole.
        self._secrets = sorted(secrets, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return _URL_IN_TEXT.sub(lambda m: display_url(m.group(0)), text)

    def describe(self, exc: BaseException) -> tuple[str, bool]:
        """A one-line, secret-free description of ``exc``, and whether anything was removed."""
        if isinstance(exc, _timeout_types()):
            return "timed out (no data within the timeout)", False
        raw = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        clean = self(raw)
        return " ".join(clean.split())[:500], clean != raw

    def __repr__(self) -> str:
        return f"Redactor({len(self._secrets)} secrets)"
