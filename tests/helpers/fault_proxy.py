"""A small threaded TCP proxy that breaks chosen connections in chosen ways.

It sits between a client and a real server on 127.0.0.1 and forwards bytes both ways. Each new
connection takes the next rule from a queue (or the standing rule when the queue is empty) and
applies it to the server's response stream, counting response bytes on that connection:

    reset     after N bytes, abort the connection (TCP RST, like a crashed peer)
    truncate  after N bytes, close cleanly (FIN): the client sees a short body
    stall     after N bytes, send nothing for T seconds, then carry on
    drop      accept, read the request, close without sending a byte

Example: ``proxy.fail_next(Fault.reset(1 << 20), Fault.truncate(3 << 20))`` breaks the next two
connections and lets later ones through. ``proxy.requests(i)`` returns what the client sent on
connection i, so a test can check the Range header a retry asked for.

Latency: ``FaultProxy(host, port, latency=(0.02, 0.05))`` holds every request (each request line
a client sends, on new and reused connections alike) for a delay drawn uniformly from that range
before it goes on to the server, so each round trip costs what it would over a slow network.
``seed`` makes the delays repeat. Faults and latency combine.
"""

from __future__ import annotations

import collections
import contextlib
import random
import re
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

_RECORD_LIMIT = 64 * 1024  # request bytes kept per connection; enough for the headers
# The start of an HTTP/1.x request: a client sends its request line first, in one piece.
_REQUEST_LINE = re.compile(rb"[A-Z]{3,7} \S+ HTTP/1\.[01]\r\n")


@dataclass(frozen=True)
class Fault:
    kind: str  # "reset" | "truncate" | "stall" | "drop"
    after: int = 0  # response bytes forwarded before the fault strikes
    seconds: float = 0.0  # stall length

    @classmethod
    def reset(cls, after: int) -> Fault:
        return cls("reset", after)

    @classmethod
    def truncate(cls, after: int) -> Fault:
        return cls("truncate", after)

    @classmethod
    def stall(cls, after: int, seconds: float) -> Fault:
        return cls("stall", after, seconds)

    @classmethod
    def drop(cls) -> Fault:
        return cls("drop")


class FaultProxy:
    """Listens on 127.0.0.1:<free port> and forwards to (target_host, target_port)."""

    def __init__(
        self,
        target_host: str,
        target_port: int,
        latency: tuple[float, float] | None = None,
        seed: int | None = None,
    ):
        self.target = (target_host, target_port)
        if latency is not None and not 0 <= latency[0] <= latency[1]:
            raise ValueError(f"latency must be (low, high) with 0 <= low <= high, got {latency}")
        self.latency = latency
        self._rng = random.Random(seed)
        self.delayed = 0  # requests held back by `latency`
        self._log: list[tuple[float, int, bytes]] = []  # (monotonic time, connection, request)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._queue: collections.deque[Fault] = collections.deque()
        self._standing: Fault | None = None
        self._sent: list[bytearray] = []  # what each connection's client sent
        self._faults_applied: list[Fault] = []
        self._sockets: set[socket.socket] = set()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accept_thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._accept_thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- rules -----------------------------------------------------------------------------
    def fail_next(self, *faults: Fault) -> None:
        """Apply these faults, in order, to the next connections (one each)."""
        with self._lock:
            self._queue.extend(faults)

    def fail_always(self, fault: Fault | None) -> None:
        """Apply this fault to every connection once the queue is empty (None: forward)."""
        with self._lock:
            self._standing = fault

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._sent)

    @property
    def faults_applied(self) -> list[Fault]:
        with self._lock:
            return list(self._faults_applied)

    def requests(self, index: int) -> bytes:
        """The bytes the client sent on connection ``index`` (0-based), at most 64 KiB."""
        with self._lock:
            return bytes(self._sent[index])

    def all_requests(self) -> bytes:
        """Everything clients sent, connection after connection."""
        with self._lock:
            return b"".join(bytes(s) for s in self._sent)

    def ranges(self) -> list[tuple[int, int]]:
        """The byte ranges requested (``Range: bytes=a-b`` as ``(a, b + 1)``), in the order the
        requests reached the proxy (recorded as they pass, before any answer, so a test can
        count them without racing the server)."""
        found = []
        for _, _, head in self.request_log():
            match = re.search(rb"(?i)\r\nrange: bytes=(\d+)-(\d+)(?:\r\n|$)", head)
            if match:
                found.append((int(match[1]), int(match[2]) + 1))
        return found

    # -- plumbing ----------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # listener closed by stop()
            with self._lock:
                fault = self._queue.popleft() if self._queue else self._standing
                index = len(self._sent)
                self._sent.append(bytearray())
                if fault is not None:
                    self._faults_applied.append(fault)
                self._sockets.add(client)
            t = threading.Thread(target=self._serve, args=(client, index, fault), daemon=True)
            t.start()
            self._threads.append(t)

    def _record(self, index: int, data: bytes) -> None:
        with self._lock:
            room = _RECORD_LIMIT - len(self._sent[index])
            if room > 0:
                self._sent[index] += data[:room]

    def _serve(self, client: socket.socket, index: int, fault: Fault | None) -> None:
        if fault is not None and fault.kind == "drop":
            with contextlib.suppress(OSError):
                client.settimeout(5)
                self._record(index, client.recv(65536))
            self._close(client)
            return
        try:
            upstream = socket.create_connection(self.target, timeout=10)
        except OSError:
            self._abort(client)  # server down: the client sees a reset, as with no proxy
            return
        upstream.settimeout(None)
        with self._lock:
            self._sockets.add(upstream)
        pump = threading.Thread(target=self._pump_requests, args=(client, upstream, index))
        pump.daemon = True
        pump.start()
        self._pump_responses(upstream, client, fault)
        pump.join(timeout=5)

    def request_log(self) -> list[tuple[float, int, bytes]]:
        """(time.monotonic(), connection index, request head) of every request, in the order
        they reached the proxy: with several connections in use, this is the one time order."""
        with self._lock:
            return list(self._log)

    def _request_delay(self, index: int, data: bytes) -> float:
        if not _REQUEST_LINE.match(data):
            return 0.0
        head = data.partition(b"\r\n\r\n")[0]
        with self._lock:
            self._log.append((time.monotonic(), index, head))
            if self.latency is None:
                return 0.0
            self.delayed += 1
            return self._rng.uniform(*self.latency)

    def _pump_requests(self, client: socket.socket, upstream: socket.socket, index: int) -> None:
        try:
            while True:
                data = client.recv(65536)
                if not data:
                    break
                self._record(index, data)
                delay = self._request_delay(index, data)
                if delay and self._stopping.wait(delay):
                    break
                upstream.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            upstream.shutdown(socket.SHUT_WR)

    def _pump_responses(
        self, upstream: socket.socket, client: socket.socket, fault: Fault | None
    ) -> None:
        forwarded = 0
        try:
            while True:
                data = upstream.recv(65536)
                if not data:
                    break
                if fault is not None and forwarded + len(data) >= fault.after:
                    head = data[: fault.after - forwarded]
                    client.sendall(head)
                    forwarded += len(head)
                    if fault.kind == "reset":
                        self._abort(client)
                        break
                    if fault.kind == "truncate":
                        break
                    # stall: hold the rest back for a while, then behave normally
                    self._stopping.wait(fault.seconds)
                    data = data[len(head) :]
                    fault = None
                client.sendall(data)
                forwarded += len(data)
        except OSError:
            pass
        self._close(client)
        self._close(upstream)

    def _abort(self, sock: socket.socket) -> None:
        # SO_LINGER with a zero timeout makes the final release send RST instead of FIN.
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self._close(sock, how=socket.SHUT_RD)

    def _close(self, sock: socket.socket, how: int = socket.SHUT_RDWR) -> None:
        # close() alone does not end a TCP connection while another thread is blocked in
        # recv() on it; shutdown() acts at once and wakes that thread.
        with contextlib.suppress(OSError):
            sock.shutdown(how)
        with contextlib.suppress(OSError):
            sock.close()
        with self._lock:
            self._sockets.discard(sock)

    def stop(self) -> None:
        self._stopping.set()
        self._close(self._listener)  # shutdown() also wakes the thread blocked in accept()
        with self._lock:
            socks = list(self._sockets)
        for s in socks:
            self._close(s)
        self._accept_thread.join(timeout=5)
        for t in self._threads:
            t.join(timeout=5)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture
def fault_proxy() -> Iterator[callable]:
    """Factory: ``fault_proxy(port)`` starts a proxy to 127.0.0.1:port, stopped at teardown."""
    proxies: list[FaultProxy] = []

    def make(port: int, host: str = "127.0.0.1", **kwargs) -> FaultProxy:
        proxy = FaultProxy(host, port, **kwargs)
        proxies.append(proxy)
        return proxy

    try:
        yield make
    finally:
        for proxy in proxies:
            proxy.stop()
