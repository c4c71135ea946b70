"""Faults between the client and real servers: every byte arrives once, in order, or we fail
with the URL and the byte offset. Resets, truncations, stalls and dropped connections come from
``fault_proxy``; the outage test stops and restarts SeaweedFS itself."""

from __future__ import annotations

import hashlib
import os
import threading
import time

import pytest

from shardtok.errors import StorageError
from shardtok.storage import RetryPolicy, open_source
from tests.helpers.fault_proxy import Fault, fault_proxy  # noqa: F401
from tests.helpers.servers import SeaweedS3, http_server, private_s3_server, s3_server  # noqa: F401

# A timeout well above any honest pause on a loaded 2-core machine, well below the stalls.
QUICK = dict(initial_delay=0.01, max_delay=0.05, timeout=1.0)
MiB = 1 << 20


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(params=["s3", "http"])
def proxied(request, fault_proxy):  # noqa: F811
    """(put(name, data) -> (url through the proxy, storage_options), proxy)."""
    server = request.getfixturevalue("s3_server" if request.param == "s3" else "http_server")
    if isinstance(server, SeaweedS3):
        proxy = fault_proxy(server.ports["s3"])

        def put(name: str, data: bytes):
            return server.put(name, data), server.storage_options(endpoint=proxy.endpoint)

    else:
        proxy = fault_proxy(server.port)

        def put(name: str, data: bytes):
            server.put(name, data)
            return f"{proxy.endpoint}/{name}", None

    return put, proxy


def test_faults_at_chosen_offsets_lose_and_repeat_nothing(proxied, caplog):
    put, proxy = proxied
    data = os.urandom(6 * MiB + 1)
    url, options = put("faults/six.bin", data)
    block = 2 * MiB
    # One fault per connection, in order; later connections are left alone.
    proxy.fail_next(
        Fault.reset(700_000),
        Fault.truncate(1_500_000),
        Fault.stall(300_000, seconds=2.5),
        Fault.drop(),
        Fault.drop(),
    )
    # All faults may hit one block, and the budget counts requests per block: leave room.
    src = open_source(url, options, RetryPolicy(max_attempts=8, **QUICK), block_size=block)
    with src.open_stream() as f:
        got = f.read()
    assert sha(got) == sha(data)
    assert len(proxy.faults_applied) == 5
    # aiohttp resends a request once by itself when a fresh connection closes before any
    # response byte (RFC 9112 9.3.1); every other fault costs one retry of ours.
    assert 4 <= src.retries <= 5
    assert caplog.text.count("retry ") == src.retries
    assert str(url) in caplog.text and "byte offset" in caplog.text

    # Several blocks are in flight at once: group the requests by the block they serve (its
    # end). A retry asks from where good bytes ended; the blocks tile the object.
    starts: dict[int, list[int]] = {}
    for start, end in proxy.ranges():
        starts.setdefault(end, []).append(start)
    resumed_inside_a_block = 0
    for tries in starts.values():
        assert tries == sorted(tries)
        resumed_inside_a_block += sum(b > a for a, b in zip(tries, tries[1:], strict=False))
    blocks = sorted((tries[0], end) for end, tries in starts.items())
    assert blocks[0][0] == 0 and blocks[-1][1] == len(data)
    assert all(a[1] == b[0] and b[1] - b[0] <= block for a, b in zip(blocks, blocks[1:]))
    assert resumed_inside_a_block >= 2, proxy.ranges()


def test_range_reads_recover_from_faults_too(proxied):
    put, proxy = proxied
    data = os.urandom(3 * MiB)
    url, options = put("faults/range.bin", data)
    proxy.fail_next(Fault.truncate(900_000), Fault.reset(500_000))
    src = open_source(url, options, RetryPolicy(max_attempts=4, **QUICK))
    assert src.read_range(1000, 2 * MiB) == data[1000 : 1000 + 2 * MiB]
    assert src.retries >= 1


def test_exhausted_budget_names_url_and_offset(proxied, caplog):
    put, proxy = proxied
    data = os.urandom(3 * MiB)
    url, options = put("faults/doomed.bin", data)
    proxy.fail_always(Fault.truncate(200_000))
    # The first request is the GET of the head (1 MiB) that also tells the size: the only
    # request in flight until it completes, so the budget below is its own.
    src = open_source(url, options, RetryPolicy(max_attempts=3, **QUICK), block_size=MiB)
    with pytest.raises(StorageError, match="gave up after 3 attempts") as info:
        src.open_stream()  # its size is what the head's GET was to tell
    exc = info.value
    assert exc.url == str(url) and str(url) in str(exc)
    assert exc.offset is not None and f"byte offset {exc.offset}" in str(exc)
    # Each attempt delivered some bytes and the next asked for the rest (with If-Match), so
    # the failure happened well inside the head.
    assert 0 < exc.offset < MiB
    assert src.retries == 2  # three attempts: two retries


def test_dropped_connections_until_the_budget_runs_out(proxied):
    put, proxy = proxied
    url, options = put("faults/dropped.bin", os.urandom(1000))
    src = open_source(url, options, RetryPolicy(max_attempts=2, **QUICK))
    proxy.fail_always(Fault.drop())
    with pytest.raises(StorageError, match="gave up after 2 attempts") as info:
        src.read_range(0, 1000)
    assert info.value.url == str(url)


def test_stalled_server_times_out_and_is_retried(proxied):
    put, proxy = proxied
    data = os.urandom(MiB)
    url, options = put("faults/stalled.bin", data)
    proxy.fail_next(Fault.stall(0, seconds=2.5))  # not even the response headers arrive
    src = open_source(url, options, RetryPolicy(max_attempts=3, **QUICK))
    assert src.read_range(0, len(data)) == data
    # At least the stalled request was retried; under load the retry may stall past the 1 s
    # timeout too, so the exact count is the machine's business, not the test's.
    assert src.retries >= 1


def test_seaweedfs_restarted_mid_stream(private_s3_server):  # noqa: F811
    server = private_s3_server
    data = os.urandom(6 * MiB)
    url = server.put("outage/six.bin", data)
    # At most 2 MiB requested ahead of the reader: the last 3 MiB are asked for after the crash,
    # whatever the machine's speed (a larger window could have fetched the whole object first).
    policy = RetryPolicy(
        max_attempts=40, initial_delay=0.05, max_delay=0.3, timeout=2, read_ahead_bytes=2 * MiB
    )
    src = open_source(url, server.storage_options(), policy, block_size=MiB)
    with src.open_stream() as f:
        head = f.read(MiB + 5)
        server.stop(kill=True)  # a crash: connections refused until it is back
        result: dict = {}

        def read_rest() -> None:
            try:
                result["rest"] = f.read()
            except BaseException as exc:
                result["error"] = exc

        reader = threading.Thread(target=read_rest)
        reader.start()
        time.sleep(1.0)  # an outage of a second or so, well within the retry budget
        server.start()  # from the main thread: the server must outlive no helper thread
        reader.join(timeout=60)
    assert "error" not in result, result
    assert sha(head + result["rest"]) == sha(data)
    assert src.retries >= 1
