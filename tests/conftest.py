"""Shared fixtures. Test modules own their specialised fixtures; only cross-cutting ones live here."""

from __future__ import annotations

import os

# Tests must never reach a model hub; the machines have none anyway.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# convert's tiktoken gate caches its verdicts; keep them out of the user's ~/.cache.
if "SHARDTOK_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["SHARDTOK_CACHE_DIR"] = tempfile.mkdtemp(prefix="shardtok-test-cache-")

# Real servers on loopback (SeaweedFS for S3, nginx for HTTP) and the fault-injecting proxy.
from fault_proxy import fault_proxy  # noqa: E402,F401
from servers import http_server, private_s3_server, s3_server  # noqa: E402,F401
