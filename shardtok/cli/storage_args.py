"""The storage switches of every command (--max-attempts, --timeout, --read-ahead-mb) in the
library's terms.

``retry_policy(args)`` is the ``RetryPolicy`` of the commands that read through
``shardtok.storage`` (stream, trace, inspect, verify: pass it as ``DatasetSource(...,
retry=...)`` or ``open_source(..., retry=...)``). Conversion reads its inputs and writes its
output through fsspec clients that retry by themselves, so for convert the same switches become
those clients' options (``client_options``). Both are None when neither switch is given: the
library's defaults then apply unchanged.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from shardtok.cli import logs
from shardtok.errors import UsageError
from shardtok.storage import RetryPolicy
from shardtok.storage.backends import client_options as _client_options
from shardtok.storage.location import is_local, protocol_of

_FAMILY = {"s3a": "s3", "https": "http"}


def retry_policy(args: argparse.Namespace) -> RetryPolicy | None:
    """The RetryPolicy --max-attempts, --timeout and --read-ahead-mb describe (the other
    fields: defaults)."""
    switches = logs.options(args)
    given = {"max_attempts": switches.max_attempts, "timeout": switches.timeout}
    if switches.read_ahead_mb is not None:
        given["read_ahead_bytes"] = int(switches.read_ahead_mb * (1 << 20))
    given = {k: v for k, v in given.items() if v is not None}
    return RetryPolicy(**given) if given else None


def client_options(args: argparse.Namespace, locations: Iterable[str]) -> dict | None:
    """``storage_options`` for convert's fsspec clients from --max-attempts and --timeout,
    for the remote ones among `locations` (inputs and --output). One option set serves all
    of them, so they must share a protocol when a switch is given."""
    switches = logs.options(args)
    if switches.max_attempts is None and switches.timeout is None:
        return None
    remote = {protocol_of(str(x)) for x in locations if not is_local(str(x))}
    families = sorted({_FAMILY.get(p, p) for p in remote})
    if not families:
        return None
    if len(families) > 1:
        raise UsageError(
            f"--max-attempts and --timeout apply to one kind of store at a time in convert; "
            f"these inputs and output use {' and '.join(families)}"
        )
    options = _client_options(
        sorted(remote)[0], max_attempts=switches.max_attempts, timeout=switches.timeout
    )
    return options or None
