"""Local paths and file:// URLs: plain OS reads, identical through every entry point."""

from __future__ import annotations

import hashlib
import os
import pickle
import subprocess
import sys
from pathlib import Path

import fsspec
import pytest

from shardtok.errors import StorageError
from shardtok.storage import ObjectNotFoundError, RetryPolicy, exists, open_source, read_bytes
from shardtok.storage.local import LocalSource
from shardtok.storage.location import display_url, join_url, local_path, protocol_of


@pytest.fixture
def blob(tmp_path: Path) -> tuple[Path, bytes]:
    data = os.urandom(3 * (1 << 20) + 17)
    path = tmp_path / "my shard#1.tar"  # a name that needs escaping in a URL
    path.write_bytes(data)
    return path, data


def _file_url(path: Path) -> str:
    return path.as_uri()  # file:///.../my%20shard%231.tar


def test_path_and_file_url_read_the_same_bytes(blob):
    path, data = blob
    for url in (str(path), path, _file_url(path)):
        with open_source(url) as src:
            assert isinstance(src, LocalSource)
            assert src.local_path == str(path) and src.path == str(path)
            assert src.size == len(data)
            assert src.read_range(0, 10) == data[:10]
            assert src.read_range(len(data) - 5, 5) == data[-5:]
            assert src.read_range(12345, 0) == b""
            with src.open_stream(1000) as f:
                assert f.read(7) == data[1000:1007]
                assert f.read() == data[1007:]
                assert f.read(1) == b""
        assert read_bytes(url) == data
        assert exists(url)


def test_local_reads_past_the_end_or_missing_fail_clearly(blob, tmp_path):
    path, data = blob
    src = open_source(path)
    with pytest.raises(StorageError, match="past the end") as info:
        src.read_range(len(data) - 4, 5)
    assert info.value.offset == len(data) - 4 and str(path) in str(info.value)
    with pytest.raises(StorageError, match="past the end"):
        src.open_stream(len(data) + 1)
    with pytest.raises(ValueError):
        src.read_range(-1, 3)
    missing = tmp_path / "nope.tar"
    with pytest.raises(ObjectNotFoundError, match="not found") as info:
        _ = open_source(missing).size
    assert str(missing) in str(info.value)
    assert isinstance(info.value, FileNotFoundError)  # so callers may catch either
    assert not exists(missing) and not exists(_file_url(missing))


def test_local_source_is_not_copied_or_deleted_by_a_cache(blob, tmp_path):
    from shardtok.storage import LocalCache

    path, data = blob
    cache = LocalCache(tmp_path / "cache", max_bytes=10)
    with open_source(_file_url(path), cache=cache) as src:
        assert isinstance(src, LocalSource)
        assert hashlib.sha256(src.open_stream().read()).digest() == hashlib.sha256(data).digest()
    assert path.read_bytes() == data
    assert list((tmp_path / "cache" / "objects").iterdir()) == []


def test_local_source_survives_pickling_and_prefetch_hint(blob):
    path, data = blob
    src = open_source(path)
    src.prefetch(0)
    assert src.read_range(5, 5) == data[5:10]
    clone = pickle.loads(pickle.dumps(open_source(path)))
    assert clone.read_range(5, 5) == data[5:10]


def test_join_url_for_paths_and_urls():
    assert join_url("s3://bucket/prefix", "shard-000.tar") == "s3://bucket/prefix/shard-000.tar"
    assert join_url("s3://bucket/prefix/", "a/b.tar") == "s3://bucket/prefix/a/b.tar"
    assert join_url("s3://bucket", "x") == "s3://bucket/x"
    assert join_url("gs://b/p", "index.json") == "gs://b/p/index.json"
    assert join_url("http://h:8080/ds", "s 1.tar") == "http://h:8080/ds/s 1.tar"
    assert join_url("/data/ds", "x.tar") == "/data/ds/x.tar"
    assert join_url("data/ds/", "x.tar") == "data/ds/x.tar"
    assert join_url("file:///data/ds", "x.tar") == "file:///data/ds/x.tar"
    assert join_url("/data/ds", "/abs/x.tar") == "/abs/x.tar"
    assert join_url("s3://b/p", "https://h/x") == "https://h/x"
    with pytest.raises(ValueError, match="query"):
        join_url("https://h/ds?sig=abc", "x")


def test_url_helpers():
    assert protocol_of("S3://b/k") == "s3" and protocol_of("/x") == "file"
    assert protocol_of("file:///x") == "file" and protocol_of("https://h/x") == "https"
    assert local_path("file:///tmp/a%20b") == "/tmp/a b"
    assert local_path("file://localhost/tmp/x") == "/tmp/x"
    with pytest.raises(ValueError, match="remote host"):
        local_path("file://otherhost/tmp/x")
    shown = display_url("https://user:hunter22@h/x?X-Amz-Signature=abcdef&v=1")
    assert "hunter22" not in shown and "abcdef" not in shown
    assert shown == "https://h/x?X-Amz-Signature=***&v=***"


def test_retry_policy_validates_and_backs_off():
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError):
        RetryPolicy(timeout=0)
    delays = RetryPolicy(initial_delay=1, multiplier=2, max_delay=5, jitter=0).delays()
    assert [next(delays) for _ in range(5)] == [1, 2, 4, 5, 5]
    jittered = RetryPolicy(initial_delay=1, jitter=0.5).delays()
    assert all(0.5 <= next(jittered) <= 1.5 for _ in range(1))


def test_unknown_protocol_is_a_clear_error():
    with pytest.raises(StorageError, match="no fsspec backend for nosuchproto://"):
        _ = open_source("nosuchproto://bucket/x").size


def test_generic_fsspec_backend_reads_ranges_and_streams():
    """Protocols without a streaming reader of ours (gs://, memory://...) use cat_file."""
    data = os.urandom(300_000)
    fsspec.filesystem("memory").pipe("/storage-test/obj.bin", data)
    url = "memory://storage-test/obj.bin"
    src = open_source(url, block_size=64 * 1024)
    assert src.size == len(data)
    assert src.read_range(70_000, 100_000) == data[70_000:170_000]
    with src.open_stream(5) as f:
        assert f.read() == data[5:]
    assert exists(url) and not exists("memory://storage-test/missing.bin")
    with pytest.raises(ObjectNotFoundError):
        read_bytes("memory://storage-test/missing.bin")


def test_gs_urls_go_to_gcsfs():
    import importlib.util

    if importlib.util.find_spec("gcsfs") is None:
        with pytest.raises(StorageError, match="gcsfs"):
            _ = open_source("gs://bucket/x.tar").size
    else:
        from shardtok.storage.backends import filesystem

        fs = filesystem("gs", {"token": "anon"}, RetryPolicy())
        assert type(fs).__name__ == "GCSFileSystem"


def test_storage_imports_without_fsspec_or_torch():
    code = (
        "import sys, shardtok.storage as s; "
        "s.open_source(sys.argv[1]).read_range(0, 1); "
        "bad = [m for m in ('torch', 'fsspec', 'aiohttp', 's3fs', 'transformers') "
        "if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code, __file__], check=True, timeout=60)
