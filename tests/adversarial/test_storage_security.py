"""Datasets from someone else, on the storage side: a manifest's shard names never reach outside
the dataset's own folder or origin, credentials go to the dataset's own origin only (redirects
included), and no message prints a URL's query values or user:password.

Every server here is a real nginx on loopback (tests/helpers/origins.py): 127.0.0.1 is the
dataset's origin, 127.0.0.2 another one that must never see the canary header.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

from shardtok.dataset.source import DatasetSource
from shardtok.errors import ResumeStateError, ShardtokError, StorageError
from shardtok.storage import Location, open_source
from shardtok.storage.location import LocationError, origin_of
from shardtok.storage.retry import Redactor
from shardtok.stream import SliceStream, StreamOptions
from shardtok.stream.resume.fingerprint import check_fingerprint
from shardtok.testing.synthetic import write_synthetic_dataset
from tests.adversarial.helpers import KINDS, republish
from tests.helpers.origins import CANARY_HEADER, logged, origins, seen_headers  # noqa: F401

CANARY = "canary-7b1e4f0d9a"
SIGNATURE = "sig-5f0c2e91d4b7"
OUTSIDE = "outside-bytes-3c9d21"  # content of a file next to (not inside) a dataset

BAD_NAMES = [
    "../x.tar",
    "../../../../etc/passwd",
    "/etc/passwd",
    "/abs/path/shard.tar",
    "file:///etc/passwd",
    "http://127.0.0.2:9/ds/shard-000000.tar",
    "s3://other-bucket/shard.tar",
    "a/b.tar",
    "a\\b.tar",
    "..",
    ".",
    ".hidden.tar",
    "",
    "x\x00.tar",
    "x\n.tar",
    "%2e%2e%2fx.tar",
    "..%2Fx.tar",
    "a%252fb.tar",
    "a%5cb.tar",
    "\uff0e\uff0e\uff0fx.tar",  # fullwidth "../": NFKC folds it into "../"
    "C:x.tar",
    "x.tar?X-Amz-Signature=1",
    "x.tar#frag",
    "x" * 300,
]
OPTIONS = StreamOptions(seq_len=64, batch_size=2)
PREFIXES = ["/data/ds", "file:///data/ds", "s3://bucket/ds", "https://127.0.0.1:8443/ds"]


def _one_line_without(text: str, *secrets: str) -> None:
    assert "\n" not in text.strip(), text
    for secret in secrets:
        assert secret not in text, text


def _full_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)) + repr(exc)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("secure") / "ds"
    write_synthetic_dataset(
        folder, num_tokens=8000, vocab_size=1000, mean_length=100, shard_size=4000
    )
    (folder.parent / "outside.tar").write_text(OUTSIDE)
    return folder


def _with_shard_name(src: Path, dst: Path, name: str, kind: str) -> Path:
    """A copy of dataset `src` whose manifest names its first shard `name`, as a dataset of
    `kind` (index.json alone, or both manifests written with the name)."""
    shutil.copytree(src, dst)
    republish(dst, lambda doc: doc["shards"][0].update(file=name), kind)
    return dst


# -- 1. shard names never leave the dataset --------------------------------------------------


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("name", BAD_NAMES)
def test_join_refuses_anything_but_a_plain_file_name(prefix, name):
    with pytest.raises(LocationError) as info:
        Location(prefix).join(name)
    assert isinstance(info.value, ShardtokError) and isinstance(info.value, ValueError)
    message = str(info.value)
    assert message.startswith(Location(prefix).display + ": refused file name")
    _one_line_without(message)


@pytest.mark.parametrize("prefix", PREFIXES)
def test_join_keeps_plain_names_inside_the_location_and_its_origin(prefix):
    root = Location(prefix)
    for name in [
        "shard-000001.tar",
        "index.json",
        "x y.tar",
        "x%20y.tar",
        "d\u00e9j\u00e0.tar",
        "a..b",
    ]:
        joined = root.join(name)
        assert joined.is_local == root.is_local
        assert origin_of(joined.url) == origin_of(root.url)
        assert str(joined).rstrip("/").rsplit("/", 1)[0] == str(root).rstrip("/")


def test_dataset_source_refuses_names_on_its_own(dataset):
    # The storage side refuses without the manifest parser's help (defense in depth).
    source = DatasetSource(dataset)
    for name in ["../outside.tar", str(dataset.parent / "outside.tar"), "file:///etc/passwd"]:
        for use in (source.open_stream, source.open_random, source.open_file, source.path_of):
            with pytest.raises(LocationError, match="refused file name") as info:
                use(name)
            _one_line_without(str(info.value), OUTSIDE)
            assert str(info.value).startswith(f"{dataset}: ")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["../outside.tar", "OUTSIDE_ABS", "file://OUTSIDE_ABS"])
def test_a_stream_never_reads_a_file_outside_the_dataset(dataset, tmp_path, name, kind):
    outside = str(dataset.parent / "outside.tar")
    name = name.replace("OUTSIDE_ABS", outside)
    bad = _with_shard_name(dataset, tmp_path / "ds", name, kind)
    shutil.copy(dataset.parent / "outside.tar", tmp_path / "outside.tar")
    with pytest.raises(ShardtokError) as info:
        next(iter(SliceStream(str(bad), OPTIONS)))
    assert OUTSIDE not in _full_text(info.value)
    _one_line_without(str(info.value), OUTSIDE)


def test_a_remote_dataset_never_reads_local_files(dataset, origins):  # noqa: F811
    shutil.copytree(dataset, origins.home.root / "remote-ds", dirs_exist_ok=True)
    source = DatasetSource(origins.home.url("remote-ds"))
    assert source.manifest.num_tokens > 0  # the dataset itself reads fine
    for name in ["/etc/passwd", "file:///etc/passwd", "../../../../etc/passwd", "%2e%2e%2fpasswd"]:
        with pytest.raises(LocationError, match="refused file name") as info:
            source.open_stream(name)
        assert "root:" not in _full_text(info.value)


def _linked_copy(dataset: Path, folder: Path, name: str, target: str | Path) -> Path:
    """A copy of `dataset` whose file `name` is a symbolic link to `target`."""
    shutil.copytree(dataset, folder)
    (folder / name).unlink(missing_ok=True)
    (folder / name).symlink_to(target)
    return folder


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("target", ["/etc/passwd", "COPY_OUTSIDE", "MISSING_OUTSIDE"])
def test_a_shard_linked_outside_the_folder_is_refused_unread(dataset, tmp_path, kind, target):
    # A working copy of the shard outside: before, the stream followed the link and served it.
    copy = tmp_path / "elsewhere" / "shard-000000.tar"
    copy.parent.mkdir()
    shutil.copy(dataset / "shard-000000.tar", copy)
    target = {"COPY_OUTSIDE": copy, "MISSING_OUTSIDE": tmp_path / "gone.tar"}.get(target, target)
    bad = _linked_copy(dataset, tmp_path / "ds", "shard-000000.tar", target)
    republish(bad, lambda doc: None, kind)
    source = DatasetSource(bad)
    shard = bad / "shard-000000.tar"
    expected = f"{shard}: a symbolic link to {os.path.realpath(target)}, outside the dataset's "
    for use in (source.open_stream, source.open_random, source.open_file):
        with pytest.raises(LocationError) as info:
            use("shard-000000.tar")
        assert str(info.value).startswith(expected), str(info.value)
        assert "root:" not in _full_text(info.value)
        _one_line_without(str(info.value))
    with pytest.raises(LocationError, match="outside the dataset's folder"):
        next(iter(SliceStream(source, OPTIONS)))


@pytest.mark.parametrize("name", ["index.json", "index.compact"])
def test_a_manifest_linked_outside_the_folder_is_refused(dataset, tmp_path, name):
    outside = tmp_path / "theirs"
    shutil.copytree(dataset, outside)
    republish(outside, lambda doc: None, "both")
    mine = tmp_path / "ds"
    shutil.copytree(outside, mine)
    (mine / name).unlink()
    (mine / name).symlink_to(outside / name)
    with pytest.raises(LocationError) as info:
        _ = DatasetSource(mine).manifest
    assert str(info.value).startswith(f"{mine / name}: a symbolic link to {outside / name},")


def test_only_links_leaving_the_folder_are_refused_unless_allowed(dataset, tmp_path):
    inside = tmp_path / "inside"
    shutil.copytree(dataset, inside)
    (inside / "store").mkdir()
    (inside / "shard-000000.tar").rename(inside / "store" / "real.tar")
    (inside / "shard-000000.tar").symlink_to("store/real.tar")  # always followed
    (tmp_path / "alias").symlink_to(inside)  # a dataset folder that is itself a link
    for where in (inside, tmp_path / "alias"):
        assert DatasetSource(where).open_random("shard-000000.tar").meta is not None
    elsewhere = tmp_path / "elsewhere.tar"
    shutil.copy(dataset / "shard-000000.tar", elsewhere)
    ds = _linked_copy(dataset, tmp_path / "ds", "shard-000000.tar", elsewhere)
    with pytest.raises(LocationError, match="outside the dataset's folder"):
        DatasetSource(ds).open_random("shard-000000.tar")
    source = pickle.loads(pickle.dumps(DatasetSource(ds, allow_symlinks_outside=True)))
    assert source.allow_symlinks_outside
    assert next(iter(SliceStream(source, OPTIONS))) is not None
    assert DatasetSource.of(str(ds), allow_symlinks_outside=True).open_random("shard-000000.tar")
    plain = pickle.loads(pickle.dumps(DatasetSource(ds)))
    with pytest.raises(LocationError, match="outside the dataset's folder"):
        plain.open_random("shard-000000.tar")


# -- 2. credentials go to the dataset's own origin only ----------------------------------------


def _secret_options() -> dict:
    return {"headers": {CANARY_HEADER: CANARY, "Authorization": f"Bearer {CANARY}"}}


@pytest.mark.parametrize("kind", KINDS)
def test_a_shard_named_by_url_on_another_host_is_refused(dataset, origins, kind):  # noqa: F811
    other_shard = origins.other.put(
        "ds/shard-000000.tar", (dataset / "shard-000000.tar").read_bytes()
    )
    bad = _with_shard_name(dataset, origins.home.root / f"cross-host-{kind}", other_shard, kind)
    source = DatasetSource(origins.home.url(bad.name), _secret_options())
    with pytest.raises(ShardtokError) as info:  # the manifest parser refuses the name
        next(iter(SliceStream(source, OPTIONS)))
    _one_line_without(str(info.value), CANARY)
    assert "a file name here is [A-Za-z0-9._-] only" in str(info.value)
    with pytest.raises(StorageError, match="refused file name"):  # and storage on its own
        source.root.join(other_shard)
    home = logged(origins.home, lambda log: CANARY in log)
    assert CANARY in home  # the dataset's own origin got its headers
    assert seen_headers(origins.other) == ""  # the other origin got no request at all


@pytest.mark.parametrize("kind", KINDS)
def test_a_redirect_to_another_origin_is_refused(dataset, origins, tmp_path, kind):  # noqa: F811
    # The dataset is complete on the other origin; whichever manifest the reader asks for first
    # (index.compact when it looks for one), the redirect is refused on that first request.
    ds = origins.other.root / f"moved-{kind}"
    shutil.copytree(dataset, ds)
    republish(ds, lambda doc: None, kind)
    path = f"/moved/moved-{kind}/"
    source = DatasetSource(origins.home.url(path.strip("/")), _secret_options())
    with pytest.raises(StorageError, match="redirected to another origin") as info:
        _ = source.manifest
    _one_line_without(str(info.value), CANARY)
    assert "http://127.0.0.2:" in str(info.value)  # names the origin, not the path
    moved = logged(origins.home, lambda log: path in log)
    assert moved.count(path) == 1  # one request, not followed and not retried
    assert CANARY not in seen_headers(origins.other)
    assert seen_headers(origins.other) == ""


def test_a_redirect_within_the_origin_is_followed_with_the_headers(dataset, origins):  # noqa: F811
    shutil.copytree(dataset, origins.home.root / "ds", dirs_exist_ok=True)
    source = DatasetSource(origins.home.url("same/ds"), _secret_options())
    assert source.manifest.num_tokens == DatasetSource(dataset).manifest.num_tokens
    with open_source(origins.home.url("same/ds/shard-000000.tar"), _secret_options()) as src:
        assert src.read_range(0, 512) == (dataset / "shard-000000.tar").read_bytes()[:512]
    home = logged(origins.home, lambda log: " /ds/shard-000000.tar" in log)
    lines = [line for line in home.splitlines() if " /ds/" in line]
    assert lines and all(CANARY in line for line in lines)


# -- 3. no query value or user:password in any message ---------------------------------------


def test_a_presigned_dataset_url_is_refused_without_its_signature(origins):  # noqa: F811
    url = origins.home.url(f"ds?X-Amz-Signature={SIGNATURE}&X-Amz-Credential=AKIA{SIGNATURE}")
    with pytest.raises(StorageError, match="query string") as info:
        _ = DatasetSource(url).manifest
    assert SIGNATURE not in _full_text(info.value)
    assert "X-Amz-Signature=***" in str(info.value)


@pytest.mark.parametrize("path", ["missing.tar", "forbidden/x.tar"])
def test_storage_errors_never_print_query_values_or_passwords(origins, path):  # noqa: F811
    base = origins.home.base_url.replace("http://", f"http://user:{SIGNATURE}p@")
    # A base64 signature as a presigned URL carries it: escaped, so the client prints it
    # in a form other than the decoded one.
    url = f"{base}/{path}?sig={SIGNATURE}%2B%2F%3D&v=1"
    with pytest.raises(StorageError) as info:
        _ = open_source(url).size
    assert SIGNATURE not in _full_text(info.value)
    _one_line_without(str(info.value))


def test_the_redactor_masks_urls_in_client_messages():
    redact = Redactor({})
    text = f"ClientResponseError: 403, url='https://u:{SIGNATURE}@h/x?sig=ab%2B{SIGNATURE}&v=1'"
    assert SIGNATURE not in redact(text)
    assert "https://h/x?sig=***&v=***" in redact(text)


def test_fingerprint_mismatch_prints_locations_redacted():
    saved = {"sources": [{"location": f"https://h/ds?sig={SIGNATURE}", "manifest_sha256": "a"}]}
    now = {"sources": [{"location": f"https://u:{SIGNATURE}@h/ds", "manifest_sha256": "b"}]}
    with pytest.raises(ResumeStateError) as info:
        check_fingerprint(saved, now)
    assert SIGNATURE not in str(info.value)
    assert "https://h/ds?sig=*** -> https://h/ds" in str(info.value)
    assert saved["sources"][0]["location"].endswith(SIGNATURE)  # stored value unchanged


# -- through the command line: one line, no traceback, no secret -------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "shardtok", *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    "command",
    [
        ["inspect", "{url}"],
        ["verify", "{url}"],
        ["stream", "{url}", "--seq-len", "64", "--batch-size", "2", "--max-batches", "1"],
    ],
)
def test_cli_errors_are_one_line_without_the_signature(origins, command):  # noqa: F811
    url = origins.home.url(f"ds?X-Amz-Signature={SIGNATURE}")
    result = _cli(*(part.format(url=url) for part in command))
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    _one_line_without(result.stderr, SIGNATURE)
    assert SIGNATURE not in result.stdout
    assert "X-Amz-Signature=***" in result.stderr


def test_cli_refuses_a_shard_linked_outside_in_one_line(dataset, tmp_path):
    ds = _linked_copy(dataset, tmp_path / "ds", "shard-000000.tar", "/etc/passwd")
    for args in (["inspect", str(ds)], ["verify", str(ds)]):
        result = _cli(*args)
        assert result.returncode != 0 and "Traceback" not in result.stderr
        assert "a symbolic link to /etc/passwd, outside the dataset's folder" in result.stderr
        assert "root:" not in result.stderr + result.stdout
        assert "looks like a bug" not in result.stderr


@pytest.mark.parametrize("kind", KINDS)
def test_cli_refuses_a_manifest_naming_a_file_outside(dataset, tmp_path, kind):
    bad = _with_shard_name(dataset, tmp_path / "ds", "../outside.tar", kind)
    shutil.copy(dataset.parent / "outside.tar", tmp_path / "outside.tar")
    for args in (["inspect", str(bad)], ["verify", str(bad)]):
        result = _cli(*args)
        assert result.returncode != 0 and "Traceback" not in result.stderr
        _one_line_without(result.stderr, OUTSIDE)
        assert OUTSIDE not in result.stdout
