"""Shared fixtures. Test modules own their specialised fixtures; only cross-cutting ones live here."""

from __future__ import annotations

import os

# Tests must never reach a model hub; the machines have none anyway.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
