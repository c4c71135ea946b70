"""Read-ahead sized from the link: the sizing rule as a pure function of measured latency and
bandwidth, and streams with several ranged GETs in flight against real loopback servers (nginx
and SeaweedFS, through the fault proxy with added latency): bytes exact and in order, memory
within the cap, cancellation, and retries of blocks in flight. No assertion depends on timing."""

from __future__ import annotations

import hashlib
import os
import threading

import pytest

from shardtok.errors import StorageError
from shardtok.storage import RetryPolicy, open_source
from shardtok.storage.base import FIRST_BLOCK_SIZE
from shardtok.storage.readahead_plan import (
    LinkEstimate,
    LinkSample,
    next_request_size,
    sample_of,
    window_bytes,
)
from tests.helpers.fault_proxy import Fault, fault_proxy  # noqa: F401
from tests.helpers.servers import SeaweedS3, http_server, s3_server  # noqa: F401

KiB, MiB = 1 << 10, 1 << 20
FAST = dict(initial_delay=0.01, max_delay=0.05, timeout=5.0)
# Each request on a connection of its own, so that the fault proxy's per-connection faults hit
# requests, whatever the order in which concurrent requests pick pooled connections.
ONE_REQUEST_PER_CONNECTION = {"headers": {"Connection": "close"}}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- the sizing rule ----------------------------------------------------------------------------


def test_window_is_two_blocks_plus_the_bandwidth_delay_product():
    block, cap = 16 * MiB, 1 << 40
    assert window_bytes(None, None, block, cap) == 2 * block  # nothing measured yet
    assert window_bytes(0.0, 1e9, block, cap) == 2 * block  # no latency: no more than that
    assert window_bytes(0.05, 100e6, block, cap) == 2 * block + 5_000_000
    # more latency or more bandwidth: more in flight, in proportion
    assert window_bytes(0.1, 100e6, block, cap) - 2 * block == 10_000_000
    assert window_bytes(0.05, 200e6, block, cap) - 2 * block == 10_000_000


def test_window_stays_within_the_cap_and_above_one_first_block():
    block = 16 * MiB
    assert window_bytes(0.05, 1e9, block, 64 * MiB) == 64 * MiB  # 82 MB wanted: capped
    assert window_bytes(None, None, block, 20 * MiB) == 20 * MiB
    assert window_bytes(None, None, block, 100 * KiB) == 100 * KiB  # a cap below a first block
    assert window_bytes(-1.0, -5.0, block, 64 * MiB) == 2 * block  # nonsense measurements


def test_requests_ramp_from_a_small_first_block_and_fit_twice_in_the_window():
    block, window = 16 * MiB, 64 * MiB
    sizes, previous = [], None
    for _ in range(7):
        previous = next_request_size(previous, block, window)
        sizes.append(previous)
    assert sizes == [FIRST_BLOCK_SIZE << i for i in range(5)] + [block, block]
    assert next_request_size(None, block, 1 * MiB) == 512 * KiB  # two must fit in the window
    assert next_request_size(8 * MiB, block, 3 * MiB) == 3 * MiB // 2
    assert next_request_size(None, 64 * KiB, window) == 64 * KiB  # block smaller than a first


def test_link_estimate_smooths_latency_and_keeps_a_high_estimate():
    link = LinkEstimate()
    assert link.high_latency() is None and link.window(MiB, 1 << 30) == 2 * MiB
    for latency in (0.02, 0.05) * 40:  # a link that jitters between 20 and 50 ms
        link.observe(LinkSample(latency, 100e6))
    assert 0.03 < link.latency < 0.04
    assert link.high_latency() > 0.045  # mean plus twice the deviation covers the jitter
    assert link.bandwidth == pytest.approx(100e6)
    assert link.window(MiB, 1 << 30) == window_bytes(link.high_latency(), 100e6, MiB, 1 << 30)
    copy = link.copy()
    assert (copy.latency, copy.deviation, copy.bandwidth) == (
        link.latency,
        link.deviation,
        link.bandwidth,
    )


def test_a_request_tells_latency_always_and_bandwidth_when_large_enough():
    assert sample_of(10.0, None, 10.5, 0) is None  # no body: nothing to say
    small = sample_of(10.0, 10.03, 10.04, 1000)
    assert small == LinkSample(pytest.approx(0.03), None)
    large = sample_of(10.0, 10.03, 10.13, 10 * MiB)
    assert large.latency == pytest.approx(0.03) and large.bandwidth == pytest.approx(10 * MiB / 0.1)


# -- streams with several requests in flight ---------------------------------------------------


@pytest.fixture(params=["s3", "http"])
def slow_link(request, fault_proxy):  # noqa: F811
    """put(name, data) -> (url, storage_options) through a proxy adding 20-50 ms per request."""
    server = request.getfixturevalue("s3_server" if request.param == "s3" else "http_server")
    port = server.ports["s3"] if isinstance(server, SeaweedS3) else server.port
    proxy = fault_proxy(port, latency=(0.02, 0.05), seed=18)

    def put(name: str, data: bytes):
        if isinstance(server, SeaweedS3):
            return server.put(name, data), server.storage_options(endpoint=proxy.endpoint)
        server.put(name, data)
        return f"{proxy.endpoint}/{name}", None

    return put, proxy


def test_many_requests_in_flight_return_every_byte_once_in_order(slow_link):
    put, proxy = slow_link
    data = os.urandom(5 * MiB + 4321)
    url, options = put("readahead/many.bin", data)
    block = 256 * KiB
    policy = RetryPolicy(read_ahead_bytes=2 * MiB, **FAST)  # up to 8 blocks in flight
    src = open_source(url, options, policy, block_size=block)
    with src.open_stream(777) as f:
        got, sizes = [], (1, 1000, 65536, 300_000, 7, 2 * MiB)
        i = 0
        while chunk := f.read(sizes[i % len(sizes)]):
            got.append(chunk)
            i += 1
        assert f.peak_held <= 2 * MiB
        assert f.tell() == len(data)
    assert sha(b"".join(got)) == sha(data[777:])
    assert proxy.delayed == len(proxy.ranges())  # every request paid the latency
    # the requests tile the object: nothing asked twice, nothing skipped
    ranges = sorted(proxy.ranges())
    assert ranges[0][0] == 0 and ranges[-1][1] == len(data)
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))


def test_more_requests_in_flight_when_the_window_is_larger(http_server, fault_proxy):  # noqa: F811
    """What a stream asks for at open is decided by the window alone: known when open returns.
    (Caps at most two blocks: the window is then the cap, whatever the link measured.)"""
    data = os.urandom(24 * MiB)  # longer than any window here: no request is cut by the end
    http_server.put("readahead/window.bin", data)
    proxy = fault_proxy(http_server.port)
    url = f"{proxy.endpoint}/readahead/window.bin"
    counts = {}
    for cap in (2 * MiB, 8 * MiB, 16 * MiB):
        policy = RetryPolicy(read_ahead_bytes=cap, **FAST)
        src = open_source(url, None, policy, block_size=8 * MiB)
        with src.open_stream() as f:
            counts[cap] = f.requests  # besides the head, which the size's GET brought
            assert f.peak_held <= cap
            assert sha(f.read()) == sha(data)
    # after the 1 MiB head: 1 MiB; 2 + 4 MiB; 2 + 4 + 8 MiB (each at most half the window)
    assert counts == {2 * MiB: 1, 8 * MiB: 2, 16 * MiB: 3}


def test_closing_a_stream_abandons_its_requests(slow_link):
    put, proxy = slow_link
    data = os.urandom(6 * MiB)
    url, options = put("readahead/closed.bin", data)
    policy = RetryPolicy(read_ahead_bytes=4 * MiB, **FAST)
    src = open_source(url, options, policy, block_size=512 * KiB)
    f = src.open_stream()
    assert f.read(100) == data[:100]
    issued = f.requests
    f.close()
    with pytest.raises(ValueError):
        f.read(1)
    # nothing is issued after close; requests under way end (their threads with them)
    assert f.requests == issued
    fetchers = [t for t in threading.enumerate() if t.name == "shardtok-readahead"]
    for t in fetchers:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in fetchers)
    assert len(proxy.ranges()) <= 1 + issued


def test_a_block_in_flight_that_fails_is_retried_from_where_it_stopped(http_server, fault_proxy):  # noqa: F811
    data = os.urandom(24 * MiB)
    http_server.put("readahead/faulty.bin", data)
    proxy = fault_proxy(http_server.port)
    url = f"{proxy.endpoint}/readahead/faulty.bin"
    # a window of 16 MiB: three requests at open, so at least two on new connections
    policy = RetryPolicy(read_ahead_bytes=16 * MiB, **FAST)
    src = open_source(url, ONE_REQUEST_PER_CONNECTION, policy, block_size=8 * MiB)
    assert src.size == len(data)  # the head's GET
    proxy.fail_next(Fault.reset(300_000), Fault.truncate(600_000))  # the next two requests
    with src.open_stream() as f:
        assert f.requests == 3
        assert sha(f.read()) == sha(data)
    # Which of the requests in flight meets which fault depends on timing; what does not:
    # each fault costs one retry, and a retry never asks again for bytes already received.
    assert src.retries == 2 and len(proxy.faults_applied) == 2
    starts: dict[int, list[int]] = {}
    for start, end in proxy.ranges():
        starts.setdefault(end, []).append(start)
    assert sum(len(tries) - 1 for tries in starts.values()) == 2
    for tries in starts.values():
        assert all(b >= a for a, b in zip(tries, tries[1:]))


def test_an_exhausted_block_in_flight_names_url_and_offset(http_server, fault_proxy):  # noqa: F811
    data = os.urandom(16 * MiB)
    http_server.put("readahead/doomed.bin", data)
    proxy = fault_proxy(http_server.port)
    url = f"{proxy.endpoint}/readahead/doomed.bin"
    policy = RetryPolicy(max_attempts=2, read_ahead_bytes=16 * MiB, **FAST)
    src = open_source(url, ONE_REQUEST_PER_CONNECTION, policy, block_size=8 * MiB)
    assert src.size == len(data)
    proxy.fail_always(Fault.truncate(100_000))  # from now on every request fails
    got = b""
    with src.open_stream() as f, pytest.raises(StorageError, match="gave up after 2") as info:
        while chunk := f.read(256 * KiB):
            got += chunk
    # the head was returned, then the error of the first block after it, in its place
    exc = info.value
    assert exc.url == url and f"byte offset {exc.offset}" in str(exc)
    assert got == data[:MiB] and MiB <= exc.offset < 3 * MiB
