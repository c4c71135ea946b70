"""Tokenizing raw corpora into shardtok datasets: `convert(ConvertOptions(...))` or `shardtok convert`.

Imports nothing heavy: transformers is loaded only when a tokenizer is.
"""

from __future__ import annotations

from shardtok.convert.progress import ConvertResult
from shardtok.convert.runner import ConvertOptions, convert
from shardtok.convert.tokenizer import BUNDLED, TokenizerSpec, load_tokenizer

__all__ = [
    "BUNDLED",
    "ConvertOptions",
    "ConvertResult",
    "TokenizerSpec",
    "convert",
    "load_tokenizer",
]
