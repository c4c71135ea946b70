"""Tokenizing raw corpora into shardtok datasets: `convert(ConvertOptions(...))` or `shardtok convert`.

Fine-tuning records: ``ConvertOptions(..., sft=prepare_sft(load_sft_config(path, {}), spec,
tokenizer_path))`` with a spec loaded with ``append_eos=False``.

Across machines: ``shardtok.convert.phases`` (``plan``, ``run_units``, ``merge``),
``shardtok.convert.unit_status.status`` and ``shardtok.convert.dask_engine.convert_with_dask``
(dask is optional and imported only there).

Imports nothing heavy: transformers is loaded only when a tokenizer is.
"""

from __future__ import annotations

from shardtok.convert.progress import ConvertResult
from shardtok.convert.runner import ConvertOptions, convert
from shardtok.convert.sft.config import SFTConfig, load_sft_config
from shardtok.convert.sft.setup import SFTSetup, prepare_sft
from shardtok.convert.tokenizer import BUNDLED, TokenizerSpec, load_tokenizer

__all__ = [
    "BUNDLED",
    "ConvertOptions",
    "ConvertResult",
    "SFTConfig",
    "SFTSetup",
    "TokenizerSpec",
    "convert",
    "load_sft_config",
    "load_tokenizer",
    "prepare_sft",
]
