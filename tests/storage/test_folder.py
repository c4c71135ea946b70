"""Folder: whole-file writes, reads, listings and deletes, the same on a local directory and on
S3 (SeaweedFS on loopback)."""

from __future__ import annotations

import os
import pickle
import uuid
import zlib
from pathlib import Path

import pytest

from shardtok.storage.folder import Folder, temporary_name
from shardtok.storage.location import LocationError
from tests.helpers.servers import s3_server  # noqa: F401


@pytest.fixture(params=["local", "s3"])
def folder(request, tmp_path) -> Folder:
    if request.param == "local":
        return Folder(tmp_path / "f")
    server = request.getfixturevalue("s3_server")
    return Folder(server.url(f"folders/{uuid.uuid4().hex}"), server.storage_options())


def test_written_bytes_read_back_whole_and_in_ranges(folder):
    folder.make()
    data = os.urandom(70_000)
    folder.write_bytes("a.bin", data)
    assert folder.read_bytes("a.bin") == data
    assert folder.read_range("a.bin", 1000, 1017) == data[1000:1017]
    assert folder.read_range("a.bin", 5, 5) == b""
    assert folder.size("a.bin") == len(data) and folder.exists("a.bin")
    assert folder.size("missing") is None and not folder.exists("missing")
    assert folder.crc32("a.bin") == zlib.crc32(data)
    folder.write_bytes("a.bin", b"replaced")  # a rewrite replaces the file whole
    assert folder.read_bytes("a.bin") == b"replaced"
    with pytest.raises(FileNotFoundError):
        folder.read_bytes("missing")
    with folder.local_file("a.bin") as path:
        assert Path(path).read_bytes() == b"replaced"


def test_put_file_publishes_and_consumes_a_scratch_file(folder):
    with folder.scratch() as scratch:
        assert scratch.is_dir()
        if folder.is_local:  # publishing is a rename on the same file system
            assert scratch.parent == Path(folder.location.local_path)
            assert scratch.name.startswith(".scratch-")
        made = scratch / "x"
        made.write_bytes(b"payload")
        folder.put_file("x.bin", made)
        assert not made.exists()
        (scratch / "left").write_bytes(b"never published")
    assert not scratch.exists()
    assert folder.read_bytes("x.bin") == b"payload"
    assert folder.list() == ["x.bin"]


def test_list_delete_and_sub_folders(folder):
    assert folder.list() == []  # a folder that does not exist yet lists empty
    sub = folder.sub("inner")
    sub.make()
    sub.write_bytes("deep.bin", b"1")
    folder.make()
    for name in ("b.bin", "a.bin", ".hidden"):
        folder.write_bytes(name, name.encode())
    assert folder.list() == [".hidden", "a.bin", "b.bin", "inner"]
    assert sub.list() == ["deep.bin"]
    folder.delete("a.bin")
    folder.delete("never-there")  # missing is fine
    folder.delete("inner")  # a folder goes with everything in it
    assert folder.list() == [".hidden", "b.bin"]
    assert sub.list() == []


def test_a_listing_never_hides_another_process_s_later_write(folder):
    folder.make()
    folder.write_bytes("a.bin", b"1")
    assert folder.list() == ["a.bin"]
    other = pickle.loads(pickle.dumps(folder))  # as a worker process would hold it
    other.write_bytes("b.bin", b"22")
    assert folder.size("b.bin") == 2
    assert folder.list() == ["a.bin", "b.bin"]


def test_a_pickled_folder_reads_and_writes_the_same_place(folder):
    folder.make()
    folder.write_bytes("a.bin", b"abc")
    copy = pickle.loads(pickle.dumps(folder))
    assert copy.read_bytes("a.bin") == b"abc"
    assert copy.storage_options == folder.storage_options
    assert copy.url("a.bin") == folder.url("a.bin")


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "..\\x", "x\0y", "line\nbreak", 7])
def test_names_that_could_leave_the_folder_are_refused(folder, name):
    for use in (
        lambda: folder.write_bytes(name, b"x"),
        lambda: folder.read_bytes(name),
        lambda: folder.delete(name),
        lambda: folder.sub(name),
    ):
        with pytest.raises(LocationError, match="refused member name"):
            use()
    assert folder.list() == []


def test_temporary_names_are_hidden_and_unique():
    names = {temporary_name("shard-000000.tar") for _ in range(100)}
    assert len(names) == 100
    assert all(n.startswith(f".shard-000000.tar.tmp-{os.getpid()}-") for n in names)


def _write_and_collect(url: str, options: dict) -> None:
    import gc

    Folder(url, options).write_bytes("child.bin", b"from the child")
    gc.collect()  # what the child dropped of its parent's is finalized now


def test_a_forked_child_leaves_the_parent_s_connections_working(s3_server, caplog):  # noqa: F811
    import logging
    import multiprocessing

    url = s3_server.url(f"folders/{uuid.uuid4().hex}")
    options = s3_server.storage_options()
    options["config_kwargs"] = dict(options["config_kwargs"], read_timeout=5)
    parent = Folder(url, options)
    with parent.scratch() as scratch:
        (scratch / "a").write_bytes(b"abc")
        parent.put_file("a.bin", scratch / "a")
    assert parent.crc32("a.bin") == zlib.crc32(b"abc")
    del parent  # its client is now held by fsspec's cache alone, which a fork empties
    child = multiprocessing.get_context("fork").Process(
        target=_write_and_collect, args=(url, options)
    )
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0
    caplog.set_level(logging.DEBUG, logger="s3fs")
    caplog.set_level(logging.DEBUG, logger="botocore.retryhandler")
    assert Folder(url, options).read_bytes("child.bin") == b"from the child"
    # A connection the child had closed under the parent answers nothing: a read timeout,
    # then a retry on a new connection.
    retried = [r.getMessage() for r in caplog.records if "retryable" in r.getMessage().lower()]
    assert retried == []
