"""Someone else's ``index.compact``: every field of its header, its dataset fields and its rows is
checked before anything uses it. A hostile file is one ``CorruptShardError`` naming
index.compact and the byte offset: no traceback, no allocation sized by a declared number, and
no name that reaches outside the dataset (the storage join refuses those too: both defences
stay).

Forged files keep every crc32 right (``_forge`` recomputes them), so each case reaches the
check it is about instead of stopping at a checksum.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
import zlib
from dataclasses import replace

import numpy as np
import pytest

from shardtok.dataset.source import DatasetSource
from shardtok.errors import CorruptShardError, StorageError
from shardtok.format import load_manifest
from shardtok.format.compact_manifest import (
    COMPACT_NAME,
    FIXED,
    HEADER_CRC_AT,
    INDEX_HEAD,
    ShardTable,
    compact_bytes,
    header_digest,
    index_head_digest,
)
from shardtok.format.manifest import MANIFEST_NAME
from shardtok.stream import SliceStream, StreamOptions
from tests.adversarial.helpers import peak_while, republish, stream_tokens
from tests.helpers.format_data import write_dataset
from tests.helpers.origins import CANARY_HEADER, origins, seen_headers  # noqa: F401

VOCAB = 5000
CANARY = "canary-0c7d55e1a2"
FIELDS = (
    "magic", "version", "flags", "n", "groups", "row_size", "num_tokens", "num_documents",
    "num_bytes", "trained", "index_sha256", "index_size", "meta_size", "name_width",
    "records_at", "reserved", "crc",
)  # fmt: skip
AT = {name: at for name, at in zip(FIELDS, (0, 8, 12, 16, 24, 28, 32, 40, 48, 56, 64, 96, 104,
                                             108, 112, 120, 124))}  # fmt: skip


def _align8(n: int) -> int:
    return -(-n // 8) * 8


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """Three shards of two documents, names following the pattern ``shard-00000i.tar``."""
    folder = tmp_path_factory.mktemp("compact") / "ds"
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, VOCAB, size=40) for _ in range(6)]
    write_dataset(folder, docs, VOCAB, frame_size=64, shard_size=100)
    return folder


@pytest.fixture
def ds(clean, tmp_path):
    return shutil.copytree(clean, tmp_path / "ds")


def _parts(data: bytes):
    head = dict(zip(FIELDS, FIXED.unpack_from(data)))
    meta = data[FIXED.size : FIXED.size + head["meta_size"]]
    sums = data[_align8(FIXED.size + head["meta_size"]) : head["records_at"]]
    return head, meta, sums, data[head["records_at"] :]


def _forge(folder, fields=None, meta=None, raw_meta=None, sums=None, cut=0, bind=True):
    """Rewrite `folder`'s index.compact: dataset fields updated with `meta` (or replaced by
    `raw_meta` bytes), group sums replaced by `sums`, then the header `fields` set, with the
    fields' size, the rows' offset and the header crc32 recomputed unless `fields` sets them;
    the file then loses its last `cut` bytes. With `bind`, index.json's compact_header_sha256
    is set to the forged header's (same length: index.json keeps its size)."""
    path = folder / COMPACT_NAME
    head, meta_bytes, sums_bytes, rows = _parts(path.read_bytes())
    if raw_meta is not None:
        meta_bytes = raw_meta
    elif meta is not None:
        meta_bytes = json.dumps({**json.loads(meta_bytes), **meta}, sort_keys=True).encode()
    if sums is not None:
        sums_bytes = np.asarray(sums, dtype="<u8").tobytes()
    head["meta_size"] = len(meta_bytes)
    head["records_at"] = _align8(FIXED.size + len(meta_bytes)) + len(sums_bytes)
    head.update(fields or {})
    out = bytearray(FIXED.pack(*(head[k] for k in FIELDS)) + meta_bytes)
    out += bytes(_align8(len(out)) - len(out)) + sums_bytes
    if "crc" not in (fields or {}):
        crc = zlib.crc32(out[FIXED.size :], zlib.crc32(out[:HEADER_CRC_AT]))
        out[HEADER_CRC_AT : HEADER_CRC_AT + 4] = struct.pack("<I", crc)
    data = bytes(out) + rows
    path.write_bytes(data[: len(data) - cut])
    if bind:  # index.json records the forged header, so each case reaches its own check
        index = folder / MANIFEST_NAME
        recorded = index_head_digest(index.read_bytes()[:INDEX_HEAD])
        forged = header_digest(out[: head["records_at"]])
        index.write_bytes(index.read_bytes().replace(recorded.encode(), forged.encode(), 1))
    return folder


def _refused(read, offset: int | None, match: str = "") -> CorruptShardError:
    with pytest.raises(CorruptShardError, match=match) as info:
        read()
    message = str(info.value)
    assert "\n" not in message, message
    assert info.value.path.endswith(COMPACT_NAME), message
    if offset is not None:
        assert info.value.offset == offset, message
    return info.value


def _manifest(folder):
    return lambda: DatasetSource(folder).manifest


def test_the_forger_keeps_a_clean_file_readable(ds):
    # Without this, every refusal below could be the forger's own damage.
    expected, before = stream_tokens(ds), (ds / COMPACT_NAME).read_bytes()
    _forge(ds)
    assert (ds / COMPACT_NAME).read_bytes() == before
    _forge(ds, meta={"extra": {"forged": True}})  # moves the sums and rows, recomputes the crc
    assert DatasetSource(ds).manifest.extra == {"forged": True}
    assert isinstance(DatasetSource(ds).manifest.shards, ShardTable)
    assert stream_tokens(ds) == expected


# -- the names pattern ------------------------------------------------------------------------

PATTERN = {"prefix": "shard-", "first": 0, "width": 6, "suffix": ".tar"}


@pytest.mark.parametrize(
    "names, match",
    [
        ({**PATTERN, "prefix": "../x/"}, "a file name here is"),
        ({**PATTERN, "prefix": "../"}, "a file name here is"),
        ({**PATTERN, "prefix": "http://127.0.0.2:9/ds/shard-"}, "a file name here is"),
        ({**PATTERN, "prefix": "/etc/"}, "a file name here is"),
        ({**PATTERN, "prefix": ".hidden-"}, "a file name here is"),
        ({**PATTERN, "suffix": ".tar/../../x"}, "a file name here is"),
        ({**PATTERN, "suffix": ".tar?sig=1"}, "a file name here is"),
        ({**PATTERN, "prefix": "x" * 250}, "a file name here is"),  # 256+ characters
        ({**PATTERN, "prefix": 1}, "'prefix' is 1, not a string"),
        ({**PATTERN, "suffix": None}, "'suffix' is None, not a string"),
        ({**PATTERN, "first": "0"}, "'first' is '0', not an integer"),
        ({**PATTERN, "first": 0.0}, "'first' is 0.0, not an integer"),
        ({**PATTERN, "first": -1}, "'first' is -1, below 0"),
        ({**PATTERN, "first": 10**300}, "more than 255 digits"),
        ({**PATTERN, "width": True}, "'width' is True, not an integer"),
        ({**PATTERN, "width": 0}, "'width' is 0, below 1"),
        ({**PATTERN, "width": 10**9}, "'width' is 1000000000, above 255"),
        ({k: v for k, v in PATTERN.items() if k != "suffix"}, "is not {prefix"),
        ({**PATTERN, "extra": 1}, "is not {prefix"),
        ([], "is not {prefix"),
        ("shard-", "is not {prefix"),
    ],
)
def test_a_hostile_names_pattern_is_refused_in_one_line(ds, names, match):
    _forge(ds, meta={"names": names})
    error = _refused(_manifest(ds), 128, match)
    assert "names" in str(error)


def test_a_pattern_width_of_a_billion_is_refused_without_building_names(ds):
    _forge(ds, meta={"names": {**PATTERN, "width": 10**9}})
    assert peak_while(lambda: _refused(_manifest(ds), 128, "above 255")) < 4 << 20


@pytest.mark.parametrize(
    "raw, match",
    [
        (b'{"dtype": 1' + b"0" * 5000 + b"}", "not valid JSON"),  # beyond int()'s digit limit
        (b'{"a": ' + b"[" * 200000 + b"]" * 200000 + b"}", "not valid JSON"),  # nesting
        (b"\xff\xfe", "not valid JSON"),
        (b"[1, 2]", "not a JSON object"),
    ],
    ids=["huge-int", "deep", "not-utf8", "list"],
)
def test_dataset_fields_that_are_not_an_object_are_refused(ds, raw, match):
    _forge(ds, raw_meta=raw)
    _refused(_manifest(ds), 128, match)


# -- names in the rows (names that follow no pattern) ----------------------------------------


@pytest.mark.parametrize(
    "name",
    ["../x.tar", "http://127.0.0.2:9/ds/shard-000000.tar", "/etc/passwd", ".hidden.tar",
     "index.json", "index.compact", "x\x01.tar"],
)  # fmt: skip
def test_a_hostile_name_in_the_rows_is_refused_when_its_row_is_read(ds, name):
    republish(ds, lambda doc: doc["shards"][1].update(file=name), "both")
    manifest = DatasetSource(ds).manifest  # the header is fine: rows are read on demand
    assert manifest.shards.header.pattern is None
    error = _refused(lambda: stream_tokens(ds), None, name.split("\x01")[0][:4])
    assert error.offset > manifest.shards.header.records_at  # the row's own offset
    assert "shard 1" in str(error)


def test_a_row_with_more_trained_tokens_than_tokens_is_refused(ds):
    def masked(doc):
        doc["sft"] = {}
        for i, shard in enumerate(doc["shards"]):
            shard["trained_tokens"] = shard["num_tokens"] + 1 if i == 1 else 0

    republish(ds, masked, "both")
    manifest = DatasetSource(ds).manifest  # the totals are consistent: the header is accepted
    assert manifest.trained_tokens <= manifest.num_tokens
    error = _refused(lambda: list(manifest.shards), None, "trained tokens of")
    assert "shard 1" in str(error) and error.offset > manifest.shards.header.records_at


# -- declared counts and sizes ----------------------------------------------------------------


def test_a_truncated_file_is_refused(ds):
    _forge(ds, cut=4)
    _refused(_manifest(ds), None, "its header describes")


@pytest.mark.parametrize(
    "fields, offset, match",
    [
        ({"n": 1 << 60}, 24, "groups for"),
        ({"n": 1 << 60, "groups": 1 << 16}, None, "rows at offset|its header describes"),
        ({"n": 4}, 24, "groups for"),
        ({"groups": 2}, 24, "groups for"),
        ({"row_size": 1 << 31}, 28, "row size"),
        ({"name_width": (1 << 32) - 1}, AT["name_width"], "name width"),
        ({"flags": 1 | 4, "name_width": (1 << 32) - 1}, AT["name_width"], "name width"),
        ({"flags": 1 << 7}, 12, "unknown flags"),
        ({"meta_size": (1 << 32) - 1}, 112, "rows at offset"),
        ({"records_at": 1 << 62}, 112, "rows at offset"),
        ({"version": 2}, 8, "version 2"),
        ({"trained": 5}, 56, "trained tokens"),
        ({"crc": 0}, HEADER_CRC_AT, "crc32"),
    ],
)
def test_declared_counts_and_sizes_are_checked_before_use(ds, fields, offset, match):
    _forge(ds, fields=fields)
    assert peak_while(lambda: _refused(_manifest(ds), offset, match)) < 4 << 20


def test_a_size_claimed_beyond_the_file_is_refused_without_allocating(ds):
    # A server may claim any size: reads are bounded (64 KiB first), a short answer is refused,
    # and no array is sized by a declared count.
    data = (ds / COMPACT_NAME).read_bytes()
    calls = []

    def read(offset, length):
        calls.append((offset, length))
        return data[offset : offset + length]

    claimed = 1 << 40
    peak = peak_while(lambda: _refused(lambda: ShardTable(read, claimed, "x/index.compact"),
                                        0, f"read {len(data)} bytes of 65536"))  # fmt: skip
    assert peak < 4 << 20 and max(length for _, length in calls) <= 64 << 10


def test_a_short_read_is_refused(ds):
    data = (ds / COMPACT_NAME).read_bytes()
    _refused(
        lambda: ShardTable(lambda o, n: data[o : o + n][:-1], len(data), "x/index.compact"),
        0,
        "read .* bytes of",
    )


def test_group_sums_that_wrap_around_to_the_total_are_refused(ds):
    head, _, sums, _ = _parts((ds / COMPACT_NAME).read_bytes())
    total = head["num_tokens"]
    assert head["groups"] == 3
    _forge(ds, sums=[1 << 63, ((1 << 63) + total) % (1 << 64), 0])  # wraps to total in int64
    _refused(_manifest(ds), _align8(FIXED.size + head["meta_size"]), "do not add up")


def test_group_sums_moved_between_groups_are_refused_when_the_rows_are_read(ds):
    head, _, sums, _ = _parts((ds / COMPACT_NAME).read_bytes())
    a, b, c = np.frombuffer(sums, dtype="<u8").tolist()
    _forge(ds, sums=[a + 1, b - 1, c])  # the total still adds up: the header is accepted
    assert DatasetSource(ds).manifest.num_tokens == head["num_tokens"]
    _refused(lambda: stream_tokens(ds), head["records_at"], "tokens differ from its sum")


def test_a_position_lookup_with_non_ascii_digits_finds_nothing(ds):
    table = DatasetSource(ds).manifest.shards
    assert table.position_of("shard-000001.tar") == 1
    for name in ["shard-\u00b2\u00b2\u00b2\u00b2\u00b2\u00b2.tar", "shard-\u0661.tar",
                 "shard-" + "1" * 5000 + ".tar"]:  # fmt: skip
        assert table.position_of(name) is None


# -- nothing reaches another origin, nothing prints a traceback -------------------------------


def _secret_options() -> dict:
    return {"headers": {CANARY_HEADER: CANARY}}


@pytest.mark.parametrize("where", ["pattern", "rows"])
def test_a_compact_manifest_naming_another_origin_sends_it_nothing(clean, origins, where):  # noqa: F811
    other = origins.other.put("ds/shard-000001.tar", (clean / "shard-000001.tar").read_bytes())
    folder = shutil.copytree(clean, origins.home.root / f"hostile-{where}")
    if where == "pattern":
        _forge(folder, meta={"names": {**PATTERN, "prefix": other[: -len("000001.tar")]}})
    else:
        republish(folder, lambda doc: doc["shards"][1].update(file=other), "both")
    source = DatasetSource(origins.home.url(folder.name), _secret_options())
    with pytest.raises(CorruptShardError, match="a file name here is") as info:
        next(iter(SliceStream(source, StreamOptions(seq_len=16, batch_size=2))))
    assert "\n" not in str(info.value) and COMPACT_NAME in str(info.value)
    with pytest.raises(StorageError, match="refused file name"):  # and storage on its own
        source.root.join(other)
    assert seen_headers(origins.other) == ""


@pytest.mark.parametrize("command", ["inspect", "verify", "stream"])
def test_the_cli_refuses_a_hostile_compact_manifest_in_one_line(ds, command):
    _forge(ds, meta={"names": {**PATTERN, "prefix": "../x/"}})
    args = [sys.executable, "-m", "shardtok", command, str(ds)]
    if command == "stream":
        args += ["--seq-len", "16", "--batch-size", "2", "--max-batches", "1"]
    result = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    output = result.stdout + result.stderr  # verify reports on stdout
    assert "Traceback" not in output
    lines = [line for line in output.splitlines() if COMPACT_NAME in line]
    assert len(lines) == 1 and "byte offset 128: names" in lines[0], output


# -- index.compact and index.json list the same shards -----------------------------------------


def _batches(folder) -> int:
    return sum(
        1 for _ in SliceStream(DatasetSource(folder), StreamOptions(seq_len=16, batch_size=2))
    )


@pytest.fixture
def eight(tmp_path):
    """Eight shards of two documents."""
    rng = np.random.default_rng(1)
    docs = [rng.integers(0, VOCAB, size=40) for _ in range(16)]
    write_dataset(tmp_path / "ds", docs, VOCAB, frame_size=64, shard_size=100)
    assert len(load_manifest(tmp_path / "ds").shards) == 8
    return tmp_path / "ds"


def test_a_compact_manifest_listing_7_of_8_shards_is_refused_by_the_stream_and_verify(eight):
    everything = _batches(eight)
    index = (eight / MANIFEST_NAME).read_bytes()
    full = load_manifest(eight)
    # Written to agree with index.json's size and sha256: only the shard list differs.
    (eight / COMPACT_NAME).write_bytes(compact_bytes(replace(full, shards=full.shards[:7]), index))
    error = _refused(lambda: _batches(eight), 0, "records another index.compact header")
    assert "not of one write" in str(error)
    result = subprocess.run([sys.executable, "-m", "shardtok", "verify", str(eight)],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "Traceback" not in output
    assert "compact_header_sha256 is not the sha256 of this header" in output, output
    (eight / COMPACT_NAME).unlink()  # the documented way out: index.json alone
    assert _batches(eight) == everything


def test_a_0_3_header_beside_an_index_json_that_records_one_is_refused(ds):
    # Dropping rows_sha256 (what 0.3 wrote) does not make a header trusted as 0.3's was.
    meta = json.loads(_parts((ds / COMPACT_NAME).read_bytes())[1])
    del meta["rows_sha256"]
    _forge(ds, raw_meta=json.dumps(meta, sort_keys=True).encode(), bind=False)
    _refused(_manifest(ds), 0, "records another index.compact header")


def test_an_index_json_that_records_no_header_beside_a_compact_that_has_one_is_refused(ds):
    index = (ds / MANIFEST_NAME).read_bytes()
    line = index.split(b"\n")[1]
    assert line.startswith(b' "compact_header_sha256": ')
    (ds / MANIFEST_NAME).write_bytes(index.replace(line, b" " * len(line), 1))  # same size
    _refused(_manifest(ds), 0, "records no compact_header_sha256")


def test_rows_that_are_not_the_headers_are_refused_once_every_row_is_read(ds):
    # Row 1's sha256 (the shard file's, which only verify compares with the file), altered
    # with its group's crc32 kept right: the header, and so index.json, still match.
    path = ds / COMPACT_NAME
    head, _, _, _ = _parts(path.read_bytes())
    data = bytearray(path.read_bytes())
    width, row = head["row_size"], head["records_at"] + head["row_size"] + 4
    data[row + 24] ^= 1
    data[row + width : row + width + 4] = struct.pack("<I", zlib.crc32(data[row : row + width]))
    path.write_bytes(bytes(data))
    manifest = DatasetSource(ds).manifest
    assert manifest.shards[1].file == "shard-000001.tar"  # one group read: its crc32 holds
    _refused(lambda: list(manifest.shards), head["records_at"], "rows_sha256")
    _refused(lambda: list(manifest.shards), head["records_at"], "rows_sha256")  # and again
