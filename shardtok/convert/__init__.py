"""Tokenizing raw corpora into shardtok datasets: `convert(ConvertJob(...))` or `shardtok convert`.

A ConvertJob describes the conversion (and is what plan.json stores); RunOptions say how this
process runs it: ``convert(job, RunOptions(workers=8))``. Fine-tuning records:
``ConvertJob(..., sft=prepare_sft(sft_config(...), spec, tokenizer_path))`` with a spec loaded
with ``append_eos=False``.

Across machines: ``shardtok.convert.job.phases`` (``plan``, ``run_units``, ``merge``),
``shardtok.convert.job.unit_status.status`` and ``shardtok.convert.engines.dask.convert_with_dask``
(dask is optional and imported only there).

Imports nothing heavy: transformers is loaded only when a tokenizer is.
"""

from __future__ import annotations

from shardtok.convert.engines.local import convert
from shardtok.convert.job.progress import ConvertResult
from shardtok.convert.job.spec import ConvertJob, RunOptions
from shardtok.convert.sft.config import SFTConfig, load_sft_config
from shardtok.convert.sft.setup import SFTSetup, prepare_sft
from shardtok.convert.tokenizing.tokenizer import BUNDLED, TokenizerSpec, load_tokenizer

__all__ = [
    "BUNDLED",
    "ConvertJob",
    "ConvertResult",
    "SFTConfig",
    "SFTSetup",
    "TokenizerSpec",
    "convert",
    "load_sft_config",
    "load_tokenizer",
    "RunOptions",
    "prepare_sft",
]
