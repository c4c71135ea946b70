"""A refused connection or an unknown host on the first request to an endpoint fails at once,
naming the endpoint; once the endpoint has answered, the same failure is retried.

Real sockets only: a port bound and closed again (nothing listens there), a name under the
reserved .invalid domain, and nginx stopped after it answered. The policies wait 5 s before a
retry, so a regression that retried would show as failed assertions on the retry records (and a
slow test), never as a pass.
"""

from __future__ import annotations

import logging
import pickle
import socket

import pytest

from shardtok.cli.main import main
from shardtok.dataset.source import DatasetSource
from shardtok.errors import StorageError
from shardtok.storage import RetryPolicy, open_source
from shardtok.storage.endpoints import EndpointUnreachableError, forget_reached
from shardtok.storage.folder import Folder
from tests.helpers.servers import Nginx

SLOW = RetryPolicy(max_attempts=10, initial_delay=5.0)
SECRET = "fail-fast-secret-9d2e"
NO_SUCH_HOST = "no-such-host.invalid"  # RFC 6761: never resolves


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def resolver_says_no() -> None:
    """The unknown-host tests need a resolver that answers "no such name" (not "try again")."""
    try:
        socket.getaddrinfo(NO_SUCH_HOST, 80)
    except socket.gaierror as exc:
        if exc.errno == socket.EAI_NONAME:
            return
    pytest.skip("this machine's resolver does not answer 'no such name' for .invalid")


def s3_options(endpoint: str) -> dict:
    return {
        "key": "fail-fast-key",
        "secret": SECRET,
        "endpoint_url": endpoint,
        "client_kwargs": {"region_name": "us-east-1"},
    }


def retries(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "shardtok.storage.remote"]


def test_s3_endpoint_refusing_the_first_request_fails_at_once(closed_port, caplog):
    caplog.set_level(logging.WARNING, logger="shardtok")
    endpoint = f"http://127.0.0.1:{closed_port}"
    source = open_source("s3://bucket/ds/index.json", s3_options(endpoint), SLOW)
    with pytest.raises(EndpointUnreachableError) as info:
        source.read_range(0, 10)
    message = str(info.value)
    assert message.startswith("s3://bucket/ds/index.json: ")
    assert f"s3 endpoint {endpoint} refused the connection" in message
    assert "endpoint_url" in message  # what to check
    assert SECRET not in message and SECRET not in repr(info.value)
    assert isinstance(info.value, StorageError) and isinstance(info.value, ConnectionError)
    assert retries(caplog) == [] and source.retries == 0


def test_http_origin_refusing_the_first_request_fails_at_once(closed_port, caplog):
    caplog.set_level(logging.WARNING, logger="shardtok")
    url = f"http://127.0.0.1:{closed_port}/ds/index.json?signature={SECRET}"
    with pytest.raises(EndpointUnreachableError) as info:
        open_source(url, None, SLOW).info()
    message = str(info.value)
    assert f"http://127.0.0.1:{closed_port} refused the connection" in message
    assert "signature=***" in message and SECRET not in message
    assert retries(caplog) == []


@pytest.mark.usefixtures("resolver_says_no")
def test_unknown_hosts_fail_at_once(caplog):
    caplog.set_level(logging.WARNING, logger="shardtok")
    with pytest.raises(EndpointUnreachableError, match=f"no such host '{NO_SUCH_HOST}'"):
        open_source(f"http://{NO_SUCH_HOST}/ds/index.json", None, SLOW).info()
    options = s3_options(f"http://{NO_SUCH_HOST}:9000")
    with pytest.raises(EndpointUnreachableError) as info:
        open_source("s3://bucket/ds/index.json", options, SLOW).info()
    assert f"s3 endpoint http://{NO_SUCH_HOST}:9000: no such host" in str(info.value)
    assert retries(caplog) == []


def test_a_refusal_after_the_endpoint_answered_is_retried(tmp_path, caplog):
    """A server that answered and then went away is restarting: its refusals are retried."""
    caplog.set_level(logging.WARNING, logger="shardtok")
    server = Nginx(tmp_path)
    server.start()
    try:
        url = server.put("x.bin", b"0123456789")
        policy = RetryPolicy(max_attempts=2, initial_delay=0.01)
        source = open_source(url, None, policy, block_size=4)  # a 4-byte head
        assert source.size == 10  # the GET of the head: the endpoint answered
    finally:
        server.stop()
    with pytest.raises(StorageError, match="gave up after 2 attempts") as info:
        source.read_range(0, 10)
    assert not isinstance(info.value, EndpointUnreachableError)
    (retry,) = retries(caplog)
    assert url in retry and "attempt 1/2 failed" in retry


def test_a_source_pickled_to_a_spawned_worker_keeps_its_endpoint_reached(tmp_path, caplog):
    """A spawned DataLoader worker starts with no endpoint reached; the source it is sent
    carries that its endpoint answered the parent, so a server restarting as the worker starts
    is retried there, not taken for a wrong port."""
    caplog.set_level(logging.WARNING, logger="shardtok")
    server = Nginx(tmp_path)
    server.start()
    try:
        url = server.put("ds/x.bin", b"0123456789")
        policy = RetryPolicy(max_attempts=2, initial_delay=0.01)
        source = DatasetSource(url.rpartition("/")[0], retry=policy)
        assert source.open_file("x.bin").size == 10  # the HEAD: the endpoint answered
        sent = pickle.dumps(source)
    finally:
        server.stop()
    forget_reached()  # what a spawned process starts with
    worker = pickle.loads(sent)
    with pytest.raises(StorageError, match="gave up after 2 attempts") as info:
        worker.open_file("x.bin").read_range(0, 10)
    assert not isinstance(info.value, EndpointUnreachableError)
    (retry,) = retries(caplog)
    assert "attempt 1/2 failed" in retry


def test_an_output_folder_on_a_refusing_endpoint_fails_at_once(closed_port):
    """convert's output (and work folder) through fsspec: botocore's own retries set to one."""
    endpoint = f"http://127.0.0.1:{closed_port}"
    options = s3_options(endpoint) | {"config_kwargs": {"retries": {"total_max_attempts": 1}}}
    with pytest.raises(EndpointUnreachableError, match=f"s3 endpoint {endpoint} refused"):
        Folder("s3://bucket/out", options).list()


def test_the_command_line_names_the_endpoint_in_one_line(
    closed_port, monkeypatch, capsys, tmp_path
):
    endpoint = f"http://127.0.0.1:{closed_port}"
    # The command line has no storage options: botocore reads its usual configuration.
    for name, value in {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "fail-fast-key",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    assert main(["inspect", "s3://bucket/ds/"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    # index.compact is the first file a dataset is asked for (index.json without one)
    assert err.startswith("shardtok inspect: error: s3://bucket/ds/index.compact: ")
    assert f"s3 endpoint {endpoint} refused the connection" in err
    # convert reads its inputs through fsspec itself; --max-attempts 1 is botocore's one try,
    # and the client's own error is named the same way rather than taken for a bug.
    out = capsys.readouterr()
    out_dir = str(tmp_path / "out")
    argv = ["--max-attempts", "1", "convert", "s3://bucket/in/x.jsonl", "-o", out_dir, "-q"]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "bug" not in err, err
    assert f"s3 endpoint {endpoint} refused the connection" in err
    assert SECRET not in err and out.out == ""


def test_convert_inputs_on_a_refusing_endpoint_fail_at_once(closed_port):
    """convert lists its inputs through fsspec: the refusal is named before botocore retries."""
    from shardtok.convert.inputs.files import discover

    endpoint = f"http://127.0.0.1:{closed_port}"
    # botocore's own retries would only make the test slower; without the check the error
    # would still be botocore's, not ours
    options = s3_options(endpoint) | {"config_kwargs": {"retries": {"total_max_attempts": 1}}}
    with pytest.raises(EndpointUnreachableError, match=f"s3 endpoint {endpoint} refused"):
        discover(["s3://bucket/in/x.jsonl"], storage_options=options)
