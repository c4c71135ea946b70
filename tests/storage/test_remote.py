"""S3 (SeaweedFS) and HTTP (nginx) on loopback: sizes, ranges, streams, errors, prefetch."""

from __future__ import annotations

import hashlib
import os
import pickle
import time

import pytest

from shardtok.errors import StorageError
from shardtok.storage import (
    AccessDeniedError,
    ObjectNotFoundError,
    RetryPolicy,
    exists,
    open_source,
    read_bytes,
)
from shardtok.storage.prefetch import Prefetcher
from shardtok.storage.remote import RemoteSource
from tests.helpers.fault_proxy import fault_proxy  # noqa: F401
from tests.helpers.servers import Nginx, SeaweedS3, http_server, s3_server  # noqa: F401

FAST = RetryPolicy(max_attempts=3, initial_delay=0.01, max_delay=0.05, timeout=5)
SECRET = "sUp3r-s3cr3t-Value-0987"
KiB, MiB = 1 << 10, 1 << 20


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def put(server, name: str, data: bytes) -> tuple[str, dict | None]:
    """Upload to either server kind; returns (url, storage_options)."""
    if isinstance(server, SeaweedS3):
        return server.put(name, data), server.storage_options()
    return server.put(name, data), None


@pytest.fixture(params=["s3", "http"])
def server(request):
    return request.getfixturevalue("s3_server" if request.param == "s3" else "http_server")


def test_size_ranges_and_streams_equal_the_bytes(server):
    data = os.urandom(5 * (1 << 20) + 333)
    url, options = put(server, "remote/five.bin", data)
    src = open_source(url, options, FAST, block_size=1 << 20)
    assert isinstance(src, RemoteSource) and src.local_path is None
    assert src.size == len(data)
    for offset, length in [(0, 1), (0, 4096), (1 << 20, 1 << 20), (len(data) - 9, 9), (77, 0)]:
        assert src.read_range(offset, length) == data[offset : offset + length]
    with src.open_stream() as f:
        assert sha(f.read()) == sha(data)
    with src.open_stream(123_457) as f:  # odd offsets and odd read sizes across block edges
        parts = []
        while chunk := f.read(300_001):
            parts.append(chunk)
        assert f.tell() == len(data)
    assert sha(b"".join(parts)) == sha(data[123_457:])
    with src.open_stream(len(data)) as f:
        assert f.read() == b""
    with pytest.raises(StorageError, match="past the end"):
        src.read_range(len(data) - 1, 2)
    assert src.retries == 0
    assert read_bytes(url, options) == data
    assert exists(url, options)


def test_empty_object(server):
    url, options = put(server, "remote/empty.bin", b"")
    src = open_source(url, options, FAST)
    assert src.size == 0 and src.read_range(0, 0) == b""
    with src.open_stream() as f:
        assert f.read() == b""
    assert read_bytes(url, options) == b""


def test_missing_object_fails_fast_and_clearly(server):
    url, options = put(server, "remote/present.bin", b"x")
    missing = url.replace("present", "absent")
    src = open_source(missing, options, RetryPolicy(max_attempts=5, initial_delay=5))
    with pytest.raises(ObjectNotFoundError, match="not found") as info:
        src.read_range(0, 1)
    assert src.retries == 0  # no retry (each would have waited 5 s)
    assert missing in str(info.value)
    assert not exists(missing, options)


def test_bad_s3_credentials_fail_fast_without_leaking_the_secret(s3_server, caplog):  # noqa: F811
    url = s3_server.put("remote/private.bin", b"secret data")
    for options in (
        s3_server.storage_options(secret=SECRET),
        {**s3_server.storage_options(), "key": "AKIA" + SECRET},
    ):
        src = open_source(url, options, RetryPolicy(max_attempts=5, initial_delay=5))
        with pytest.raises(AccessDeniedError, match="access denied") as info:
            src.read_range(0, 4)
        assert src.retries == 0
        exc = info.value
        assert url in str(exc)
        for text in (str(exc), repr(exc), repr(src), str(exc.__cause__), str(exc.__context__)):
            assert SECRET not in text
        with pytest.raises(AccessDeniedError):
            exists(url, options)
    assert SECRET not in caplog.text


def test_http_403_and_credentials_in_the_url(http_server):  # noqa: F811
    http_server.put("forbidden/x.bin", b"x")
    with pytest.raises(AccessDeniedError, match="403"):
        _ = open_source(http_server.url("forbidden/x.bin"), None, FAST).size
    # user:password in a URL reach the server but never a message or repr
    data = os.urandom(1000)
    http_server.put("remote/auth.bin", data)
    with_auth = http_server.url("remote/auth.bin").replace("://", f"://reader:{SECRET}@")
    src = open_source(with_auth, None, FAST)
    assert src.read_range(0, 1000) == data and SECRET not in repr(src) + src.url
    missing = open_source(with_auth.replace("auth.bin", "gone.bin"), None, FAST)
    with pytest.raises(ObjectNotFoundError) as info:
        _ = missing.size
    assert SECRET not in str(info.value) + repr(info.value) + str(info.value.__cause__)


def test_http_5xx_is_retried_then_reported_with_url_and_offset(http_server, caplog):  # noqa: F811
    url = http_server.url("unavailable/x.bin")
    src = open_source(url, None, RetryPolicy(max_attempts=3, initial_delay=0.01))
    with pytest.raises(StorageError, match="gave up after 3 attempts") as info:
        _ = src.size
    assert src.retries == 2 and url in str(info.value) and "503" in str(info.value)
    assert caplog.text.count("retry") == 2


def test_object_replaced_while_reading_is_refused(server):
    """Retries and later blocks ask with If-Match: bytes of two versions never mix."""
    first = os.urandom(MiB + 200_000)  # more than the head that the first GET brings
    url, options = put(server, "remote/replaced.bin", first)
    src = open_source(url, options, FAST)
    assert src.read_range(0, 100) == first[:100]
    put(server, "remote/replaced.bin", os.urandom(MiB + 200_000))
    if isinstance(server, Nginx):
        # nginx's ETag is the mtime in whole seconds and the size: a replacement of the same
        # size within the same second would keep the first version's, so it is dated later
        path = server.root / "remote/replaced.bin"
        later = path.stat().st_mtime_ns + 2 * 10**9
        os.utime(path, ns=(later, later))
    assert src.read_range(100, 100) == first[100:200]  # the head, kept: the first version's
    with pytest.raises(StorageError, match="changed while it was being read"):
        src.read_range(MiB + 100, 100)


def test_prefetch_starts_the_first_block_early(http_server, fault_proxy):  # noqa: F811
    data = os.urandom(3 * MiB)
    http_server.put("remote/prefetched.bin", data)
    proxy = fault_proxy(http_server.port)  # no faults: it counts the requests
    url = f"{proxy.endpoint}/remote/prefetched.bin"
    src = open_source(url, None, FAST, block_size=MiB)
    src.prefetch()
    with src.open_stream() as f:
        assert sha(f.read()) == sha(data)
    blocks = [(0, MiB), (MiB, 2 * MiB), (2 * MiB, 3 * MiB)]
    # (sorted: the prefetch and the stream's fetcher may use different connections)
    assert sorted(proxy.ranges()) == blocks  # the prefetched block was used, not fetched again

    with Prefetcher(block_size=MiB, retry=FAST) as prefetcher:
        prefetcher.prefetch(url)
        prefetcher.prefetch(url)  # already going: no second fetch
        with prefetcher.open_stream(url) as f:
            assert f.read(10) == data[:10]
            assert sha(f.read()) == sha(data[10:])
        assert sorted(proxy.ranges()) == sorted(blocks * 2)
        with prefetcher.open_stream(url, offset=5) as f:  # nothing prefetched: plain stream
            assert f.read() == data[5:]
        assert len(proxy.ranges()) == 9


def test_read_ahead_never_holds_more_than_its_cap(http_server, fault_proxy):  # noqa: F811
    """Requests are issued by the reader's own calls, so what a stream asked for is known
    the moment a read returns: never more unread bytes than read_ahead_bytes."""
    block = 64 * KiB
    data = os.urandom(20 * block + 123)
    http_server.put("remote/bounded.bin", data)
    proxy = fault_proxy(http_server.port)
    cap = 3 * block  # below two blocks plus any measured bandwidth-delay product
    policy = RetryPolicy(initial_delay=0.01, read_ahead_bytes=cap)
    src = open_source(f"{proxy.endpoint}/remote/bounded.bin", None, policy, block_size=block)
    with src.open_stream() as f:
        assert f.read(1) == data[:1]  # the head (one block) is being read
        assert f.peak_held <= cap and f.requests == 2  # 64 KiB head + 2 x 64 KiB = the cap
        time.sleep(0.3)  # a stream that ran further ahead would ask for more now
        assert len(proxy.ranges()) == 1 + f.requests  # the head's GET, then the stream's
        got = f.read(block)  # the head is released: room for one more block
        assert got == data[1 : block + 1] and f.requests == 3
        assert f.read() == data[block + 1 :]
        assert f.peak_held <= cap
    ranges = proxy.ranges()
    assert sorted(ranges) == [(a, min(a + block, len(data))) for a in range(0, len(data), block)]


def test_sources_pickle_without_threads_and_reopen(s3_server):  # noqa: F811
    data = os.urandom(100_000)
    url = s3_server.put("remote/pickled.bin", data)
    src = open_source(url, s3_server.storage_options(), FAST)
    src.prefetch()
    clone = pickle.loads(pickle.dumps(src))
    assert clone.read_range(10, 10) == data[10:20]
    with clone.open_stream() as f:
        assert f.read() == data


def _no_aws_environment(monkeypatch) -> None:
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)


def test_s3_configuration_from_the_environment(s3_server, monkeypatch):  # noqa: F811
    url = s3_server.put("remote/env.bin", b"configured by the environment")
    _no_aws_environment(monkeypatch)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    assert read_bytes(url) == b"configured by the environment"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    with pytest.raises(AccessDeniedError) as info:
        read_bytes(url, retry=FAST)
    assert SECRET not in str(info.value) + repr(info.value) + str(info.value.__cause__)


def test_s3_configuration_from_a_profile(s3_server, monkeypatch, tmp_path):  # noqa: F811
    url = s3_server.put("remote/profile.bin", b"configured by a profile")
    _no_aws_environment(monkeypatch)
    (tmp_path / "credentials").write_text(
        f"[shardtok]\naws_access_key_id = {s3_server.access_key}\n"
        f"aws_secret_access_key = {s3_server.secret_key}\n"
    )
    (tmp_path / "config").write_text(
        f"[profile shardtok]\nregion = us-east-1\nendpoint_url = {s3_server.endpoint}\n"
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    assert read_bytes(url, {"profile": "shardtok"}) == b"configured by a profile"
    monkeypatch.setenv("AWS_PROFILE", "shardtok")
    assert read_bytes(url) == b"configured by a profile"


def test_s3_without_any_credentials_fails_fast(s3_server, monkeypatch, tmp_path):  # noqa: F811
    url = s3_server.put("remote/nocreds.bin", b"x")
    _no_aws_environment(monkeypatch)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance-metadata lookups
    options = {"endpoint_url": s3_server.endpoint, "client_kwargs": {"region_name": "us-east-1"}}
    src = open_source(url, options, RetryPolicy(max_attempts=5, initial_delay=5))
    with pytest.raises(AccessDeniedError, match="no credentials found"):
        src.read_range(0, 1)
    assert src.retries == 0
