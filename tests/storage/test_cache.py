"""LocalCache: whole objects, never partial, LRU within the limit, shared by processes."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import random
import traceback

import numpy as np
import pytest

from shardtok.dataset.source import DatasetSource
from shardtok.errors import StorageError
from shardtok.storage import LocalCache, RetryPolicy, open_source
from shardtok.stream import SliceStream, StreamOptions
from shardtok.testing.synthetic import write_synthetic_dataset
from tests.helpers.fault_proxy import Fault, fault_proxy  # noqa: F401
from tests.helpers.servers import http_server, s3_server  # noqa: F401

FAST = RetryPolicy(max_attempts=3, initial_delay=0.01, max_delay=0.05, timeout=5)
KiB = 1 << 10


def cached_files(cache: LocalCache) -> list[str]:
    return sorted(p.name for p in (cache.folder / "objects").iterdir())


def test_second_open_reads_the_cached_copy(http_server, tmp_path, fault_proxy):  # noqa: F811
    data = os.urandom(300 * KiB)
    http_server.put("cache/a.bin", data)
    proxy = fault_proxy(http_server.port)  # no faults: it counts the requests
    url = f"{proxy.endpoint}/cache/a.bin"
    cache = LocalCache(tmp_path / "cache", max_bytes=10 << 20)
    with open_source(url, None, FAST, cache=cache, block_size=64 * KiB) as src:
        assert src.read_range(1000, 10) == data[1000:1010]
        with src.open_stream(5) as f:
            assert f.read() == data[5:]
    downloaded = proxy.ranges()
    # once, whole: the head GET that told the size, then the rest (several GETs in flight)
    blocks = [(a, min(a + 64 * KiB, len(data))) for a in range(0, len(data), 64 * KiB)]
    assert sorted(downloaded) == blocks
    with open_source(url, None, FAST, cache=cache) as again:
        assert again.read_range(0, len(data)) == data
    assert proxy.ranges() == downloaded  # no new GET: served from disk
    assert cache.total_bytes() == len(data)
    (name,) = cached_files(cache)
    assert name.endswith("-a.bin")
    assert list((tmp_path / "cache" / "tmp").iterdir()) == []


def test_changed_object_gets_a_new_entry(http_server, tmp_path):  # noqa: F811
    url = http_server.put("cache/changing.bin", b"one" * 1000)
    cache = LocalCache(tmp_path / "cache", max_bytes=1 << 20)
    assert open_source(url, None, FAST, cache=cache).read_range(0, 3) == b"one"
    http_server.put("cache/changing.bin", b"two" * 2000)  # new size, new ETag
    assert open_source(url, None, FAST, cache=cache).read_range(0, 3) == b"two"
    assert len(cached_files(cache)) == 2


def test_least_recently_used_objects_are_evicted(http_server, tmp_path):  # noqa: F811
    cache = LocalCache(tmp_path / "cache", max_bytes=250 * KiB)
    blobs = {n: os.urandom(100 * KiB) for n in "abcd"}
    urls = {n: http_server.put(f"lru/{n}.bin", blob) for n, blob in blobs.items()}

    def read(name: str) -> None:
        with open_source(urls[name], None, FAST, cache=cache) as src:
            assert src.read_range(0, 100 * KiB) == blobs[name]

    read("a")
    read("b")
    held = open_source(urls["a"], None, FAST, cache=cache)  # an open reader of "a"
    assert held.read_range(0, 10) == blobs["a"][:10]  # and "a" is now the most recent
    read("c")  # over the limit: "b" is the least recently used
    assert {n[-5] for n in cached_files(cache)} == {"a", "c"}
    read("d")  # then "a"
    assert {n[-5] for n in cached_files(cache)} == {"c", "d"}
    assert cache.total_bytes() <= cache.max_bytes
    # The evicted file stays readable through the descriptor its reader holds.
    assert held.read_range(50 * KiB, 100) == blobs["a"][50 * KiB : 50 * KiB + 100]
    held.close()


def test_failed_download_leaves_nothing_behind(http_server, tmp_path, fault_proxy):  # noqa: F811
    data = os.urandom(400 * KiB)
    http_server.put("cache/broken.bin", data)
    proxy = fault_proxy(http_server.port)
    cache = LocalCache(tmp_path / "cache", max_bytes=1 << 20)
    url = f"{proxy.endpoint}/cache/broken.bin"
    src = open_source(url, None, RetryPolicy(max_attempts=2, **_quick()), cache=cache)
    proxy.fail_always(Fault.truncate(150 * KiB))
    with pytest.raises(StorageError, match="gave up"):
        src.read_range(0, 10)
    assert cached_files(cache) == []
    assert list((tmp_path / "cache" / "tmp").iterdir()) == []
    proxy.fail_always(None)
    assert open_source(url, None, FAST, cache=cache).read_range(0, len(data)) == data


def _quick() -> dict:
    return {"initial_delay": 0.01, "max_delay": 0.05, "timeout": 2}


def _worker(seed: int, urls: list[str], digests: list[str], options, folder, limit, largest, q):
    try:
        cache = LocalCache(folder, max_bytes=limit)
        rng = random.Random(seed)
        for _ in range(12):
            i = rng.randrange(len(urls))
            with open_source(urls[i], options, FAST, cache=cache, block_size=128 * KiB) as src:
                with src.open_stream() as f:
                    assert hashlib.sha256(f.read()).hexdigest() == digests[i], urls[i]
                offset = rng.randrange(src.size)
                with src.open_stream(offset) as g:
                    assert src.read_range(offset, 1) == g.read(1)
            total = cache.total_bytes()
            assert total <= limit + largest, f"cache holds {total} bytes, limit {limit}"
        q.put((seed, None))
    except BaseException:
        q.put((seed, traceback.format_exc()))


def test_four_processes_share_one_cache(s3_server, tmp_path):  # noqa: F811
    sizes = [300 * KiB, 200 * KiB, 350 * KiB, 100 * KiB, 250 * KiB, 150 * KiB]
    blobs = [os.urandom(n) for n in sizes]
    urls = [s3_server.put(f"shared/obj-{i}.bin", b) for i, b in enumerate(blobs)]
    digests = [hashlib.sha256(b).hexdigest() for b in blobs]
    options = s3_server.storage_options()
    limit = 600 * KiB
    folder = tmp_path / "cache"
    # Use the S3 client in this process first: forked workers must not reuse its event loop.
    assert open_source(urls[0], options, FAST).read_range(0, 4) == blobs[0][:4]
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    procs = [
        ctx.Process(
            target=_worker,
            args=(seed, urls, digests, options, folder, limit, max(sizes), q),
        )
        for seed in range(4)
    ]
    for p in procs:
        p.start()
    results = dict(q.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
    assert all(err is None for err in results.values()), results
    cache = LocalCache(folder, max_bytes=limit)
    assert cache.total_bytes() <= limit + max(sizes)
    assert list((folder / "tmp").iterdir()) == []
    for path in (folder / "objects").iterdir():  # every entry is a complete, correct object
        assert hashlib.sha256(path.read_bytes()).hexdigest() in digests


def _damage(path) -> None:
    """Flip bytes in the middle of a cached file, its size unchanged (what a disk error or a
    hand edit leaves, and the size check alone cannot see)."""
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        middle = f.read(16)
        f.seek(-16, os.SEEK_CUR)
        f.write(bytes(b ^ 0xFF for b in middle))


def test_a_damaged_cached_object_is_evicted_and_fetched_again(s3_server, tmp_path, caplog):  # noqa: F811
    data = os.urandom(300 * KiB)
    url = s3_server.put("damaged/obj.bin", data)
    options = s3_server.storage_options()
    folder = tmp_path / "cache"
    assert open_source(url, options, FAST, cache=LocalCache(folder, 10 << 20)).read_range(0, 4)
    (path,) = (folder / "objects").iterdir()
    _damage(path)
    for run in range(2):  # later runs: the first fetches again, the next finds it intact
        caplog.clear()
        cache = LocalCache(folder, 10 << 20)
        with (
            caplog.at_level("WARNING", logger="shardtok.storage.cache"),
            open_source(url, options, FAST, cache=cache) as src,
        ):
            assert src.read_range(0, len(data)) == data
        warnings = [r.getMessage() for r in caplog.records]
        if run == 0:
            (message,) = warnings
            assert message.startswith(f"{path}: the cached copy of {url} fails its check")
            assert "evicted, fetching it again" in message and "\n" not in message
        else:
            assert warnings == []
        assert path.read_bytes() == data
    assert list((folder / "tmp").iterdir()) == []


def test_a_stream_through_a_damaged_cache_reads_the_object_again(s3_server, tmp_path, caplog):  # noqa: F811
    local = tmp_path / "ds"
    write_synthetic_dataset(local, num_tokens=6000, vocab_size=1000, mean_length=100)
    for file in local.iterdir():
        s3_server.put(f"damaged-ds/{file.name}", file.read_bytes())
    options = StreamOptions(seq_len=32, batch_size=4)
    cache = {"cache_dir": tmp_path / "cache", "cache_bytes": 64 << 20}

    def tokens(source) -> list:  # every batch of an epoch, as plain lists
        return [
            {k: np.asarray(v).tolist() for k, v in b.items()} for b in SliceStream(source, options)
        ]

    want = tokens(DatasetSource(local))
    remote = s3_server.url("damaged-ds")
    assert tokens(DatasetSource(remote, s3_server.storage_options(), **cache)) == want
    (path,) = (tmp_path / "cache" / "objects").glob("*shard-000000.tar")
    _damage(path)
    with caplog.at_level("WARNING", logger="shardtok.storage.cache"):
        assert tokens(DatasetSource(remote, s3_server.storage_options(), **cache)) == want
    assert [str(path) in r.getMessage() for r in caplog.records] == [True]
