"""Client benchmark for shardtok.storage against loopback SeaweedFS (S3) and nginx (HTTP).

    python benchmarks/bench_storage.py [--mb 256] [--repeat 3] [--seconds 5]

Measures, per client: sequential MB/s over the whole object in 16 MiB ranges, and 1 MiB random
range reads per second (one thread). Best and median of --repeat interleaved runs. Needs weed,
nginx (tools/install-test-servers.sh), s3fs and obstore.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from servers import Nginx, SeaweedS3  # noqa: E402

from shardtok.storage import RetryPolicy, open_source  # noqa: E402

BLOCK = 16 << 20
RANGE = 1 << 20


def seq_rate(read_block, size):
    t = time.perf_counter()
    n = 0
    for off in range(0, size, BLOCK):
        n += len(read_block(off, min(BLOCK, size - off)))
    assert n == size
    return size / (time.perf_counter() - t) / 1e6


def rand_rate(read_range, size, seconds):
    rng = random.Random(0)
    t = time.perf_counter()
    k = 0
    while time.perf_counter() - t < seconds:
        off = rng.randrange(0, size - RANGE)
        assert len(read_range(off, RANGE)) == RANGE
        k += 1
    return k / (time.perf_counter() - t)


def shardtok_stream_rate(src, size):
    t = time.perf_counter()
    n = 0
    with src.open_stream() as f:
        while chunk := f.read(1 << 20):
            n += len(chunk)
    assert n == size
    return size / (time.perf_counter() - t) / 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    size = args.mb << 20
    root = Path(tempfile.mkdtemp(prefix="bench-storage-"))
    s3 = SeaweedS3(root / "s3")
    s3.start()
    web = Nginx(root / "www")
    web.start()
    data = os.urandom(size)
    local = root / "obj.bin"
    local.write_bytes(data)
    s3.client().upload_file(str(local), s3.bucket, "obj.bin")
    os.link(local, web.root / "obj.bin")
    opts = s3.storage_options()
    s3_url, http_url = s3.url("obj.bin"), web.url("obj.bin")
    policy = RetryPolicy()

    import obstore
    import s3fs
    from obstore.store import HTTPStore, S3Store

    fs = s3fs.S3FileSystem(**opts)
    store = S3Store(
        s3.bucket,
        endpoint=s3.endpoint,
        access_key_id=s3.access_key,
        secret_access_key=s3.secret_key,
        region="us-east-1",
        client_options={"allow_http": True},
    )
    hstore = HTTPStore.from_url(web.base_url, client_options={"allow_http": True})

    def obs(st, key):
        return lambda off, n: obstore.get_range(st, key, start=off, end=off + n)

    sources = {
        "s3 shardtok": open_source(s3_url, opts, policy),
        "http shardtok": open_source(http_url, None, policy),
    }
    cases = {
        "s3 shardtok (s3fs) read_range": sources["s3 shardtok"].read_range,
        "s3 s3fs cat_file (raw)": lambda off, n: fs.cat_file(
            f"{s3.bucket}/obj.bin", start=off, end=off + n
        ),
        "s3 obstore get_range (raw)": obs(store, "obj.bin"),
        "http shardtok (aiohttp) read_range": sources["http shardtok"].read_range,
        "http obstore get_range (raw)": obs(hstore, "obj.bin"),
    }
    results: dict[str, dict[str, list[float]]] = {}
    for _ in range(args.repeat):
        for name, fn in cases.items():
            r = results.setdefault(name, {"seq": [], "rand": []})
            r["seq"].append(seq_rate(fn, size))
            r["rand"].append(rand_rate(fn, size, args.seconds))
        for name in ("s3 shardtok", "http shardtok"):
            r = results.setdefault(name + " open_stream (read-ahead)", {"seq": [], "rand": []})
            r["seq"].append(shardtok_stream_rate(sources[name], size))
    print(f"object {args.mb} MiB, {args.repeat} interleaved runs, {os.cpu_count()} CPUs")
    print("best run (the machine is shared: best approximates an idle one) / median")
    print(f"{'client':44s} {'seq MB/s':>14s} {'1MiB reads/s':>14s}")
    for name, r in results.items():
        seq = f"{max(r['seq']):6.0f} / {statistics.median(r['seq']):5.0f}"
        rand = (
            f"{max(r['rand']):6.0f} / {statistics.median(r['rand']):5.0f}"
            if r["rand"]
            else f"{'-':>14s}"
        )
        print(f"{name:44s} {seq:>14s} {rand:>14s}")
    s3.stop()
    web.stop()
    import shutil

    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
