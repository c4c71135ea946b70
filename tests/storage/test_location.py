"""Locations: the one place that tells local paths from URLs, decodes, joins and redacts."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from shardtok.dataset.source import DatasetSource
from shardtok.storage import Location, open_source


def test_file_urls_are_percent_decoded():
    assert Location("file:///tmp/a%20b").local_path == "/tmp/a b"
    assert Location("file://localhost/tmp/x%25y").local_path == "/tmp/x%y"
    assert Location("/tmp/a%20b").local_path == "/tmp/a%20b"  # a plain path is taken as is
    with pytest.raises(ValueError, match="remote host"):
        Location("file://otherhost/tmp/x")


@pytest.mark.parametrize(
    ("url", "protocol", "local"),
    [
        ("/data/ds", "file", True),
        ("data/ds", "file", True),
        ("file:///data/ds", "file", True),
        ("http://h/ds", "http", False),
        ("HTTPS://h/ds", "https", False),
        ("s3://bucket/ds", "s3", False),
        ("gs://bucket/ds", "gs", False),
    ],
)
def test_protocol_and_is_local(url, protocol, local):
    where = Location(url)
    assert where.protocol == protocol and where.is_local is local
    if not local:
        with pytest.raises(ValueError, match="not a local path"):
            _ = where.local_path


@pytest.mark.parametrize("prefix", ["/data/ds", "/data/ds/", "file:///data/ds", "file:///data/ds/"])
def test_join_onto_local_paths(prefix):
    joined = Location(prefix).join("shard-000001.tar")
    assert joined.is_local and joined.local_path == "/data/ds/shard-000001.tar"
    assert str(joined) == joined.display == "/data/ds/shard-000001.tar"
    with pytest.raises(ValueError, match="refused file name"):  # names stay inside (LocationError)
        Location(prefix).join("/abs/x.tar")


def test_joined_names_are_not_decoded_again():
    where = Location("file:///data/a%20b").join("x%20y.tar")
    assert where.local_path == "/data/a b/x%20y.tar"
    assert Location("./data//ds/").join("x.tar").local_path == "data/ds/x.tar"


@pytest.mark.parametrize(
    "prefix", ["s3://b/ds", "s3://b/ds/", "gs://b/ds", "https://h:8080/ds", "http://h/ds/"]
)
def test_join_onto_url_prefixes(prefix):
    joined = Location(prefix).join("x.tar")
    assert not joined.is_local
    assert joined.url == prefix.rstrip("/") + "/x.tar"
    assert joined.name == "x.tar"


def test_presigned_urls_name_one_object():
    # A query string signs one object: it stays on that URL, and no name is joined onto it.
    signed = Location("https://h/ds/x.tar?X-Amz-Signature=abc&v=1")
    assert signed.name == "x.tar" and signed.url.endswith("?X-Amz-Signature=abc&v=1")
    with pytest.raises(ValueError, match="query string") as info:
        Location("https://h/ds?sig=secret").join("x.tar")
    assert "secret" not in str(info.value)


def test_display_redacts_userinfo_and_query_values():
    shown = Location("https://user:hunter22@h:8443/x?X-Amz-Signature=abcdef&v=1").display
    assert shown == "https://h:8443/x?X-Amz-Signature=***&v=***"
    assert "hunter22" not in repr(Location("s3://user:hunter22@b/k").display)
    assert Location("file:///tmp/a%20b").display == "/tmp/a b"


def test_locations_pickle_and_compare():
    where = Location("file:///tmp/a%20b")
    assert pickle.loads(pickle.dumps(where)) == where
    assert Location.of(where) is where and Location.of(Path("/x")).local_path == "/x"


def test_open_source_and_dataset_take_file_urls_with_escapes(tmp_path):
    folder = tmp_path / "a b"
    folder.mkdir()
    (folder / "blob.bin").write_bytes(b"hello")
    url = "file://" + str(folder).replace(" ", "%20")
    with open_source(Location(url).join("blob.bin")) as src:
        assert src.read_range(0, 5) == b"hello"
    dataset = DatasetSource(url)
    assert dataset.is_local and dataset.path_of("blob.bin") == str(folder / "blob.bin")
    assert dataset.open_file("blob.bin").read_range(1, 3) == b"ell"


def test_convert_output_must_be_local():
    from shardtok.convert.job.output_dir import OutputDirError, resolve_output

    assert resolve_output("file:///tmp/out%201") == "/tmp/out 1"
    assert resolve_output("data/out/") == "data/out/"
    with pytest.raises(OutputDirError, match="only a local folder") as info:
        resolve_output("s3://user:pw@bucket/out")
    assert "pw" not in str(info.value)
