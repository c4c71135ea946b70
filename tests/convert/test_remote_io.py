"""Inputs on S3 (SeaweedFS on loopback) read exactly as the same bytes on local disk: discovery
by prefix, glob or name with ETags, the same unit plan, the same records from every format,
the same damage errors, and byte-identical work units from real worker processes."""

from __future__ import annotations

import gzip
import json
import random
import struct
import uuid
from pathlib import Path

import pytest
import zstandard

from shardtok.convert.inputs.compressed import DamagedInputError, _FrameWalk, check_zstd_frames
from shardtok.convert.inputs.files import InputError, discover
from shardtok.convert.inputs.records import RangeReader
from shardtok.convert.inputs.units import plan_units
from shardtok.storage.folder import Folder
from tests.convert.test_workdir import tokenize_in_workers, unit_files, worker_config
from tests.helpers.servers import s3_server  # noqa: F401

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
]


def _texts(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 90))) for _ in range(count)]
    texts[5] = "a" * 70_000  # one line longer than the line-start scan's 64 KiB step
    texts[9] = "z" * 3000  # long runs become RLE blocks in zstd
    return texts


def _jsonl(texts: list[str]) -> bytes:
    lines = [json.dumps({"text": t}) for t in texts]
    lines[3] = '{"text": broken'  # rejects travel the same way
    lines[7] = ""  # blank lines are separators
    return ("\n".join(lines) + "\n").encode()


def _zstd_frames(data: bytes) -> bytes:
    """Several frames with and without checksums, after a skippable frame."""
    parts = [struct.pack("<II", 0x184D2A53, 5) + b"skip!"]
    for n, start in enumerate(range(0, len(data), 30_000)):
        compressor = zstandard.ZstdCompressor(write_checksum=n % 2 == 0)
        parts.append(compressor.compress(data[start : start + 30_000]))
    return b"".join(parts)


def _parquet(texts: list[str]) -> bytes:
    import io

    table = pa.table({"text": texts, "n": list(range(len(texts)))})
    buffer = io.BytesIO()
    pq.write_table(table, buffer, row_group_size=40)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, bytes]:
    jsonl = _jsonl(_texts(1, 400))
    return {
        "a.jsonl": jsonl,
        "b.jsonl.gz": gzip.compress(_jsonl(_texts(2, 150)), mtime=0),
        "c.jsonl.zst": _zstd_frames(_jsonl(_texts(3, 150))),
        "d.parquet": _parquet(_texts(4, 130)),
        "sub/e.txt": ("\n".join(_texts(5, 60)) + "\n").encode(),
    }


@pytest.fixture(scope="module")
def places(corpus, s3_server, tmp_path_factory):  # noqa: F811
    """The corpus on local disk and under an S3 prefix: (local folder, S3 prefix URL)."""
    local = tmp_path_factory.mktemp("inputs")
    prefix = f"inputs/{uuid.uuid4().hex}"
    for name, data in corpus.items():
        (local / name).parent.mkdir(parents=True, exist_ok=True)
        (local / name).write_bytes(data)
        s3_server.put(f"{prefix}/{name}", data)
    return local, s3_server.url(prefix)


def _relative(files, root: str) -> list[tuple]:
    return [(f.path[len(root) :].lstrip("/"), f.kind, f.compression, f.size) for f in files]


def test_a_prefix_lists_like_a_local_folder_with_etags(places, s3_server):  # noqa: F811
    local, prefix = places
    options = s3_server.storage_options()
    for extra in (".hidden/x.jsonl", ".y.jsonl", "z.bin", "out/index.json"):
        s3_server.put(f"{prefix[len('s3://' + s3_server.bucket) + 1 :]}/{extra}", b"{}\n")
    expected = _relative(discover([str(local)]), str(local))
    for given in (prefix + "/", prefix):  # ending in "/" or naming a "folder"
        files = discover([given], exclude_dir=prefix + "/out", storage_options=options)
        assert _relative(files, prefix) == expected
        assert all(f.path.startswith(prefix + "/") and f.mtime_ns == 0 for f in files)
    head = s3_server.client().head_object(
        Bucket=s3_server.bucket, Key=files[0].path.split("/", 3)[3]
    )
    assert files[0].etag == head["ETag"]
    assert len({f.etag for f in files}) == len(files)
    unexcluded = discover([prefix + "/"], storage_options=options)
    assert [f.path for f in unexcluded][-2:] == [prefix + "/out/index.json", prefix + "/sub/e.txt"]


def test_globs_and_single_files(places, s3_server):  # noqa: F811
    local, prefix = places
    options = s3_server.storage_options()
    files = discover([prefix + "/*.jsonl*"], storage_options=options)
    assert [f.path for f in files] == [prefix + "/a.jsonl", prefix + "/b.jsonl.gz",
                                       prefix + "/c.jsonl.zst"]  # fmt: skip
    assert [f.path for f in discover([prefix + "/s*/*.txt"], storage_options=options)] == [
        prefix + "/sub/e.txt"
    ]
    (one,) = discover([prefix + "/c.jsonl.zst"], storage_options=options)
    assert (one.kind, one.compression, one.size) == (
        "jsonl",
        "zstd",
        (local / "c.jsonl.zst").stat().st_size,
    )
    assert one.etag


@pytest.mark.parametrize(
    "given, message",
    [
        ("/missing.jsonl", "does not exist"),
        ("/nothing-here/", "holds no .jsonl"),
        ("/*.csv", "matches no input files"),
        ("/z.bin", "unknown input format"),
    ],
)
def test_remote_input_mistakes_are_one_line(places, s3_server, given, message):  # noqa: F811
    _, prefix = places
    s3_server.put(f"{prefix[len('s3://' + s3_server.bucket) + 1 :]}/z.bin", b"x")
    with pytest.raises(InputError, match=message):
        discover([prefix + given], storage_options=s3_server.storage_options())


def test_a_file_given_twice_is_refused(places, s3_server):  # noqa: F811
    _, prefix = places
    with pytest.raises(InputError, match="given twice"):
        discover([prefix + "/a.jsonl", prefix + "/"], storage_options=s3_server.storage_options())


def _both(places, s3_server, txt_mode="lines"):  # noqa: F811
    local, prefix = places
    options = s3_server.storage_options()
    names = ["a.jsonl", "b.jsonl.gz", "c.jsonl.zst", "d.parquet", "sub/e.txt"]
    local_files = discover([str(local / n) for n in names])
    remote_files = discover([f"{prefix}/{n}" for n in names], storage_options=options)
    return local_files, remote_files, options


@pytest.mark.parametrize("txt_mode", ["lines", "file"])
def test_the_same_plan_and_records_as_the_local_bytes(places, s3_server, txt_mode):  # noqa: F811
    local_files, remote_files, options = _both(places, s3_server)
    units = plan_units(local_files, 20_000, txt_mode)
    assert plan_units(remote_files, 20_000, txt_mode, storage_options=options) == units
    assert len(units) > 5 and any(len(u.pieces) > 1 for u in units)
    seen_kinds = set()
    for unit in units:
        for piece in unit.pieces:
            file = local_files[piece.input_index]
            seen_kinds.add((file.kind, file.compression))
            for objects in (False, True):
                readers = [
                    RangeReader(f, piece, "text", txt_mode, objects=objects, storage_options=o)
                    for f, o in ((file, None), (remote_files[piece.input_index], options))
                ]
                local_records, remote_records = (list(r) for r in readers)
                assert remote_records == local_records
                assert readers[1].records == readers[0].records
    assert len(seen_kinds) == 5


def _cut(data: bytes, kind: str) -> bytes:
    if kind == "gz":
        return data[: len(data) // 2]
    if kind == "zst-mid-frame":
        return data[: len(data) - 9]
    return data + b"\x28\xb5"  # two bytes where a frame should start


@pytest.mark.parametrize("kind", ["gz", "zst-mid-frame", "zst-trailing"])
def test_damaged_remote_inputs_fail_like_local_ones(corpus, s3_server, tmp_path, kind):  # noqa: F811
    source = corpus["b.jsonl.gz" if kind == "gz" else "c.jsonl.zst"]
    name = "cut.jsonl." + ("gz" if kind == "gz" else "zst")
    data = _cut(source, kind)
    (tmp_path / name).write_bytes(data)
    url = s3_server.put(f"damaged/{uuid.uuid4().hex}/{name}", data)
    errors = []
    for given, options in ((str(tmp_path / name), None), (url, s3_server.storage_options())):
        files = discover([given], storage_options=options)
        (unit,) = plan_units(files, 1 << 30, "lines", storage_options=options)
        with pytest.raises(DamagedInputError) as info:
            list(RangeReader(files[0], unit.pieces[0], "text", "lines", storage_options=options))
        errors.append((info.value.offset, info.value.reason))
    assert errors[0] == errors[1]
    assert errors[0][0] is not None


def test_the_streaming_frame_walk_agrees_with_the_seeking_one(corpus, tmp_path):
    data = corpus["c.jsonl.zst"]
    rng = random.Random(7)
    cuts = sorted({len(data)} | {rng.randrange(len(data)) for _ in range(60)} | set(range(12)))
    path = tmp_path / "x.zst"
    for cut in cuts:
        for tail in (b"", b"\x00", b"\x28\xb5\x2f\xfd"):
            path.write_bytes(data[:cut] + tail)
            try:
                check_zstd_frames(str(path))
                expected = None
            except DamagedInputError as exc:
                expected = str(exc)
            walk = _FrameWalk(str(path))
            blob, pos = path.read_bytes(), 0
            try:
                while pos < len(blob):
                    step = rng.choice((1, 3, 7, 4096, 70_000))
                    walk.feed(blob[pos : pos + step])
                    pos += step
                walk.finish()
                got = None
            except DamagedInputError as exc:
                got = str(exc)
            assert got == expected, (cut, tail)


def test_a_remote_file_changed_since_the_plan_is_refused(s3_server):  # noqa: F811
    options = s3_server.storage_options()
    key = f"changing/{uuid.uuid4().hex}/x.jsonl"
    url = s3_server.put(key, b'{"text": "one"}\n')
    files = discover([url], storage_options=options)
    (unit,) = plan_units(files, 1 << 30, "lines", storage_options=options)
    s3_server.put(key, b'{"text": "two"}\n')  # same size, other bytes: only the ETag tells
    with pytest.raises(InputError, match="changed since the conversion was planned"):
        list(RangeReader(files[0], unit.pieces[0], "text", "lines", storage_options=options))


def test_workers_make_identical_units_from_s3_inputs_and_into_an_s3_work_folder(
    places,
    s3_server,  # noqa: F811
    tmp_path: Path,
):
    local_files, remote_files, options = _both(places, s3_server)
    units = plan_units(local_files, 30_000, "lines")
    outputs = {
        "local inputs": (local_files, Folder(tmp_path / "a")),
        "S3 inputs": (remote_files, Folder(tmp_path / "b", options)),
        "S3 inputs, S3 work": (
            remote_files,
            Folder(s3_server.url(f"work/{uuid.uuid4().hex}"), options),
        ),
    }
    made = {}
    for what, (files, out) in outputs.items():
        config = worker_config(files, out, stop=False, txt_mode="lines", storage_options=options)
        results = tokenize_in_workers(config, units)
        made[what] = ([r.to_json() for r in results], unit_files(out))
    reference = made.pop("local inputs")
    assert len(reference[1]) == 4 * len(units)
    assert any(json.loads(r)["rejects"] for r in reference[0])
    for what, got in made.items():
        assert got == reference, what
