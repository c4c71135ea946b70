"""Two real nginx origins on loopback for the credential tests: ``home`` (127.0.0.1) and
``other`` (127.0.0.2, a different origin although both are this machine).

Both log, per request, the headers a leak would show: ``X-Shardtok-Canary``, ``Authorization``
and ``Cookie``. ``home`` also redirects:

    /moved/<path>  ->  302 to other's /<path>    (another origin)
    /same/<path>   ->  302 to home's /<path>     (same origin)
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.servers import Nginx

CANARY_HEADER = "X-Shardtok-Canary"
_HEADER_LOG = """
    log_format headers '$request_method $request_uri $status '
                       '"$http_x_shardtok_canary" "$http_authorization" "$http_cookie"';
    access_log {path} headers;
"""


def seen_headers(server: Nginx) -> str:
    """What ``server`` logged of the requests it received so far, less the readiness probe
    (``HEAD /`` from ``Nginx.start``)."""
    try:
        text = (server.folder / "headers.log").read_text(errors="replace")
    except FileNotFoundError:
        return ""
    return "".join(line for line in text.splitlines(True) if not line.startswith("HEAD / "))


def logged(server: Nginx, condition, bound: float = 30.0) -> str:
    """What `server` logged once `condition(log)` holds. nginx writes a request's log line after
    it has sent the response, so a client can be done before the line is there: wait for it
    (with a generous bound, never asserting a duration), and return the log either way."""
    deadline = time.monotonic() + bound
    while True:
        text = seen_headers(server)
        if condition(text) or time.monotonic() > deadline:
            return text
        time.sleep(0.02)


@dataclass
class Origins:
    home: Nginx
    other: Nginx


def _nginx(folder: Path, host: str, server_extra: str = "") -> Nginx:
    log = _HEADER_LOG.format(path=folder / "headers.log")
    return Nginx(folder, host=host, http_extra=log, server_extra=server_extra)


@pytest.fixture(scope="module")
def origins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Origins]:
    other = _nginx(tmp_path_factory.mktemp("other-origin"), "127.0.0.2")
    other.start()
    redirects = (
        f"location ^~ /moved/ {{ rewrite ^/moved/(.*)$ {other.base_url}/$1 redirect; }}\n"
        "        location ^~ /same/ { rewrite ^/same/(.*)$ /$1 redirect; }"
    )
    home = _nginx(tmp_path_factory.mktemp("home-origin"), "127.0.0.1", redirects)
    try:
        home.start()
        yield Origins(home, other)
    finally:
        home.stop()
        other.stop()
