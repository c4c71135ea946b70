"""Someone else's files (issue 36): export-megatron and verify check a shard against its manifest
entry before decoding or writing anything, a zstd bomb costs neither memory nor output, an
import vocabulary below the pair's ids is a user error, and no message quotes the bytes of a
file that is not a shard."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import zstandard

from shardtok.cli.main import main
from shardtok.errors import CorruptShardError, UsageError
from shardtok.format import ShardReader
from shardtok.format.manifest import MANIFEST_NAME
from shardtok.format.megatron import write_megatron_pair
from shardtok.format.megatron_io import export_megatron, import_megatron
from shardtok.format.mmidx import encode_idx
from shardtok.format.tar import BLOCK, encode_header
from tests.adversarial.helpers import republish
from tests.helpers.format_data import write_dataset

REPO = Path(__file__).resolve().parents[2]
VOCAB = 5000
# The bomb: one frame of this many zero bytes, a few KB compressed. Refused from the shard's
# head, a run stays far below MAX_RSS; decoded and written, it would need twice the bomb.
BOMB_BYTES = 512 << 20
MAX_RSS = 256 << 20

# Runs a shardtok command and prints its peak RSS last: VmHWM, which starts afresh with the
# process's image (getrusage's ru_maxrss would carry over the forking test process's own peak).
_MEASURED = (
    "import sys\n"
    "from shardtok.cli.main import main\n"
    "rc = main(sys.argv[1:])\n"
    "status = open('/proc/self/status').read().split('VmHWM:')[1]\n"
    "print(int(status.split()[0]) * 1024)\n"
    "sys.exit(rc)\n"
)


def measured(*args) -> tuple[subprocess.CompletedProcess, int]:
    """A shardtok command run in a process of its own: (the finished run, its peak RSS in bytes)."""
    if not Path("/proc/self/status").exists():
        pytest.skip("peak RSS is read from /proc (Linux)")
    done = subprocess.run(
        [sys.executable, "-c", _MEASURED, *map(str, args)],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    return done, int(done.stdout.strip().splitlines()[-1])


def shardtok(capsys, *args) -> subprocess.CompletedProcess:
    """A shardtok command run here (no peak to measure), as a finished run."""
    capsys.readouterr()
    status = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, status, out, err)


def one_line_error(done: subprocess.CompletedProcess, status: int, *words: str) -> str:
    assert done.returncode == status, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "looks like a bug" not in lines[0], lines[0]
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def _equal_documents(seed: int, count: int = 6, length: int = 40):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, VOCAB, size=length) for _ in range(count)]


def _write(folder, docs, level=3, **options):
    # One document per frame, two per shard: every shard holds the same number of tokens.
    options = {"frame_size": 64, "shard_size": 100, **options}
    return write_dataset(folder, docs, VOCAB, compression_level=level, **options)


def _assert_not_exported(prefix: Path) -> None:
    # not even the folder the pair would go to
    assert not prefix.parent.exists(), sorted(p.name for p in prefix.parent.iterdir())


# -- a shard that is not the one the manifest lists ------------------------------------------


@pytest.mark.parametrize("level", [3, None], ids=["zstd", "uncompressed"])
def test_export_refuses_swapped_shards_of_equal_size(capsys, tmp_path, level):
    manifest = _write(tmp_path / "ds", _equal_documents(0), level)
    a, b = (tmp_path / "ds" / e.file for e in manifest.shards[:2])
    assert a.stat().st_size == b.stat().st_size
    a.rename(tmp_path / "tmp")
    b.rename(a)
    (tmp_path / "tmp").rename(b)
    out = tmp_path / "out" / "corpus"
    done = shardtok(capsys, "export-megatron", tmp_path / "ds", out)
    one_line_error(done, 1, str(a), "not the shard index.json lists as shard-000000.tar")
    _assert_not_exported(out)
    with pytest.raises(CorruptShardError, match="not the shard"):
        export_megatron(tmp_path / "ds", tmp_path / "api" / "corpus")
    _assert_not_exported(tmp_path / "api" / "corpus")


def _contradict_dtype(doc, folder):
    doc["dtype"] = "int32"


def _contradict_vocab(doc, folder):
    doc["vocab_size"] = VOCAB + 1


def _contradict_key(doc, folder):
    # The file and its entry renamed alike: everything matches except the key inside it.
    entry = doc["shards"][1]
    (folder / entry["file"]).rename(folder / "renamed.tar")
    entry["file"] = "renamed.tar"


@pytest.mark.parametrize(
    "edit, words",
    [
        (_contradict_dtype, ("dtype 'int32'", "'uint16'")),
        (_contradict_vocab, (f"vocab_size {VOCAB + 1}", f"{VOCAB}")),
        (_contradict_key, ("renamed.tar", "'shard-000001.tar'")),
    ],
    ids=["dtype", "vocab", "key"],
)
def test_export_refuses_a_manifest_contradicting_its_shards(capsys, tmp_path, edit, words):
    folder = tmp_path / "ds"
    _write(folder, _equal_documents(0))
    republish(folder, lambda doc: edit(doc, folder), "both")
    out = tmp_path / "out" / "corpus"
    done = shardtok(capsys, "export-megatron", folder, out)
    one_line_error(done, 1, "not the shard index.json lists", *words)
    _assert_not_exported(out)


# -- a zstd bomb ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bomb_dataset(tmp_path_factory) -> Path:
    """A dataset whose first shard was replaced by a crafted one: a single document of
    BOMB_BYTES zero bytes in one zstd frame of a few KB, consistent in itself (json, idx, frame
    table, crc32, bin_sha256), in a file of the size index.json lists. Only the counts (and the
    meta_sha256) tell it from the shard the manifest names."""
    folder = tmp_path_factory.mktemp("bomb") / "ds"
    manifest = _write(folder, [np.arange(200) % VOCAB], shard_size=1 << 20, frame_size=1 << 20)
    path = folder / manifest.shards[0].file
    meta = ShardReader(path).meta
    chunk = b"\0" * (8 << 20)
    crc, digest = 0, hashlib.sha256()
    compressor = zstandard.ZstdCompressor(level=1, write_checksum=True)
    frame = compressor.compressobj(size=BOMB_BYTES)
    stored = []
    for _ in range(BOMB_BYTES // len(chunk)):
        crc = zlib.crc32(chunk, crc)
        digest.update(chunk)
        stored.append(frame.compress(chunk))
    stored.append(frame.flush())
    bomb = b"".join(stored)
    assert len(bomb) < 64 << 10
    tokens = BOMB_BYTES // meta.dtype.itemsize
    idx = encode_idx(np.asarray([tokens], dtype=np.int64), meta.dtype)
    fields = {k: getattr(meta, k) for k in meta.__dataclass_fields__}
    forged = meta.__class__(
        **{
            **fields,
            "num_tokens": tokens,
            "frames": (meta.frames[0].__class__(0, len(bomb), 0, 0, BOMB_BYTES, crc),),
            "bin_sha256": digest.hexdigest(),
            "idx_sha256": hashlib.sha256(idx).hexdigest(),
            "read_sha256": None,
        }
    )
    out = bytearray()
    for name, member in (
        (forged.json_member, forged.to_json_bytes()),
        (forged.idx_member, idx),
        (forged.bin_member, bomb),
    ):
        out += encode_header(name, len(member)) + member + b"\0" * (-len(member) % BLOCK)
    out += b"\0" * (2 * BLOCK)
    path.write_bytes(bytes(out))
    doc = json.loads((folder / MANIFEST_NAME).read_text())
    doc["shards"][0].update(bytes=len(out), sha256=hashlib.sha256(out).hexdigest())
    republish(folder, lambda d: d.update(doc), "both")
    return folder


def test_export_refuses_a_zstd_bomb_before_decoding_it(bomb_dataset, tmp_path):
    out = tmp_path / "out" / "corpus"
    done, peak = measured("export-megatron", bomb_dataset, out)
    one_line_error(done, 1, "shard-000000.tar", "not the shard", "num_tokens 200")
    _assert_not_exported(out)
    assert peak < MAX_RSS, f"peak RSS {peak >> 20} MiB"


def test_verify_compares_declared_sizes_before_decoding_a_bomb(bomb_dataset):
    done, peak = measured("verify", bomb_dataset)
    assert done.returncode == 1, done.stderr
    bad = [line for line in done.stdout.splitlines() if line.startswith("BAD")]
    assert len(bad) == 1 and "shard-000000.tar" in bad[0], done.stdout
    assert f"token count 200, the shard has {BOMB_BYTES // 2}" in bad[0], bad[0]
    assert peak < MAX_RSS, f"peak RSS {peak >> 20} MiB"


# -- import-megatron's vocabulary -----------------------------------------------------------


def test_import_vocab_size_below_the_pairs_ids_is_a_usage_error(capsys, tmp_path):
    tokens = np.arange(300, dtype=np.uint16)
    write_megatron_pair(tmp_path / "pair", [tokens[:120], tokens[120:]], np.uint16)
    done = shardtok(
        capsys, "import-megatron", tmp_path / "pair", tmp_path / "ds", "--vocab-size", 100
    )
    one_line_error(
        done, 2, str(tmp_path / "pair.bin"), "largest token id is 299", "(--vocab-size) 100"
    )
    assert "(sequence 1)" in done.stderr and f"byte offset {299 * 2}" in done.stderr
    with pytest.raises(UsageError, match="largest token id is 299"):
        import_megatron(tmp_path / "pair", tmp_path / "api", vocab_size=100)


def test_import_refuses_a_negative_token_id_as_bad_data(capsys, tmp_path):
    tokens = np.array([5, 7, -3, 9], dtype=np.int32)
    write_megatron_pair(tmp_path / "pair", [tokens], np.int32)
    done = shardtok(
        capsys, "import-megatron", tmp_path / "pair", tmp_path / "ds", "--vocab-size", 100
    )
    one_line_error(done, 1, str(tmp_path / "pair.bin"), "byte offset 8", "token id -3")


# -- messages never quote a file that is not a shard ----------------------------------------

PIN = b"1234567"
SECRET = (
    b"root:x:0:0:root:/root:/bin/bash\nlogin\nsync:x:4:65534:sync:/bin:/bin/sync\n"
    b"api_token=2f9c1e77d0b4a3c5 0o1234567 ustar\0 " * 12
)


def _fragments(data: bytes, width: int = 4) -> set[str]:
    """Every run of `width` printable bytes of `data`, as text and as Python would repr it."""
    out = set()
    for i in range(len(data) - width + 1):
        piece = data[i : i + width]
        text = piece.decode("latin-1")
        if text.isprintable():
            out.add(text)
        out.add(repr(piece)[2:-1])
    return out


def _headers_that_are_not_shards() -> list[bytes]:
    """The first block as a text file, a text file whose checksum field holds octal digits,
    and as a valid ustar header of someone else's tar (a link, a name with a newline)."""
    text = SECRET[:BLOCK]
    octal = bytearray(text)
    octal[148:156] = PIN + b" "  # parsed as a number, a message could still give it away
    link = bytearray(encode_header("secret.txt", 10))
    link[156:157] = b"2"
    link[157:168] = b"/etc/shadow"
    odd_name = bytearray(encode_header("secret.txt", 10))
    odd_name[0:20] = b"pw\nhunter2/home/x.js"
    headers = []
    for block in (link, odd_name):
        block[148:156] = b" " * 8
        block[148:156] = b"%06o\0 " % sum(block)
        headers.append(bytes(block))
    return [SECRET, bytes(octal) + SECRET[BLOCK:], *(h + SECRET for h in headers)]


@pytest.mark.parametrize(
    "content", _headers_that_are_not_shards(), ids=["text", "octal", "link", "name"]
)
def test_errors_never_quote_a_file_that_is_not_a_shard(capsys, tmp_path, content):
    folder = tmp_path / "ds"
    manifest = _write(folder, _equal_documents(0))
    shard = str(folder / manifest.shards[0].file)
    Path(shard).write_bytes(content)
    start = content[:BLOCK]
    forbidden = {f for f in _fragments(start) if len(f.strip()) == 4}
    forbidden |= {str(int(PIN, 8)), "b'", 'b"'}
    messages = []
    done = shardtok(capsys, "export-megatron", folder, tmp_path / "out")
    messages.append(one_line_error(done, 1, "shard-000000.tar", "byte offset"))
    done = shardtok(capsys, "verify", folder)
    messages += [line for line in done.stdout.splitlines() if line.startswith("BAD")]
    assert len(messages) == 2
    for message in messages:
        # the path is ours; what follows it (member, offset, reason) must not echo the file
        reason = message.split(shard, 1)[-1]
        quoted = sorted(f for f in forbidden if f in reason)
        assert quoted == [], (quoted, message)
