"""Loading a Hugging Face tokenizer for conversion, and encoding text batches into token arrays.

Loading goes through ``transformers`` (it knows tokenizer folders, added tokens and special-token
maps for 4.x and 5.x), but the workers only need the Rust ``tokenizers`` backend: the spec handed
to them is the backend's serialized JSON, which is also what the fingerprint hashes. Encoding with
the backend's ``encode_batch_fast`` skips the offsets and Python dicts that
``tokenizer(texts)["input_ids"]`` builds (benchmarks/bench_convert.py measures the difference).

Nothing here downloads: transformers is told to stay offline and to read local files only.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shardtok.errors import ShardtokError
from shardtok.format.mmidx import dtype_for_vocab

BUNDLED = "bundled"
BUNDLED_PATH = Path(__file__).resolve().parent.parent / "assets" / "tokenizer"
BUNDLED_NAME = "shardtok-bpe-8k"

# Tried in order when a bare tokenizer.json names no EOS/BOS (it has no tokenizer_config.json).
_CONVENTIONAL_EOS = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eot_id|>", "[SEP]")
_CONVENTIONAL_BOS = ("<|begin_of_text|>", "<s>", "<bos>", "<|bos|>", "[CLS]")


# Rust tokenizers already built in this process, by fingerprint. Forked workers inherit them and
# skip re-parsing the JSON (0.5 s of CPU per worker for a 128k-entry vocabulary).
_LOADED_BACKENDS: dict[str, object] = {}


class TokenizerLoadError(ShardtokError):
    """The tokenizer cannot be loaded or lacks what the options need (say, an EOS token)."""


@dataclass(frozen=True)
class TokenizerSpec:
    """Everything a worker process needs to encode exactly as the parent would (picklable)."""

    name: str
    backend_json: str
    fingerprint: str
    vocab_size: int
    eos_id: int | None
    bos_id: int | None
    append_eos: bool
    prepend_bos: bool

    @property
    def dtype(self) -> np.dtype:
        return dtype_for_vocab(self.vocab_size)

    def as_metadata(self) -> dict:
        """The tokenizer description stored in every shard and in the manifest."""
        return {
            "name": self.name,
            "fingerprint": self.fingerprint,
            "eos_id": self.eos_id,
            "bos_id": self.bos_id,
        }


def _load_transformers_tokenizer(path: Path):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers import PreTrainedTokenizerFast  # 1 s import: only here

    try:
        if path.is_dir() and (path / "tokenizer.json").exists():
            # tokenizer.json is the serialized truth; PreTrainedTokenizerFast reads it together
            # with tokenizer_config.json/special_tokens_map.json, and unlike AutoTokenizer it does
            # not import torch (2+ s) on the way.
            tok = PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)
        elif path.is_dir():
            from transformers import AutoTokenizer  # can convert vocab/merges or sentencepiece

            tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True, use_fast=True)
        else:
            tok = PreTrainedTokenizerFast(tokenizer_file=str(path))
    except Exception as exc:  # transformers raises many types (OSError, ValueError, KeyError...)
        raise TokenizerLoadError(f"cannot load tokenizer from {path}: {exc}") from exc
    if not getattr(tok, "is_fast", False) or getattr(tok, "backend_tokenizer", None) is None:
        raise TokenizerLoadError(
            f"{path}: only fast (Rust `tokenizers`) tokenizers are supported; "
            "this folder has no tokenizer.json"
        )
    return tok


def _special_id(tok, attr: str, conventional: tuple[str, ...], explicit: str | None) -> int | None:
    vocab = tok.get_vocab()
    if explicit is not None:
        if explicit not in vocab:
            raise TokenizerLoadError(f"token {explicit!r} is not in the tokenizer's vocabulary")
        return int(vocab[explicit])
    token_id = getattr(tok, attr, None)
    if token_id is not None:
        return int(token_id)
    # A bare tokenizer.json carries no eos/bos configuration; its added special tokens do.
    added = {
        t.content for t in tok.backend_tokenizer.get_added_tokens_decoder().values() if t.special
    }
    for candidate in conventional:
        if candidate in added:
            return int(vocab[candidate])
    return None


def load_tokenizer(
    source: str,
    *,
    append_eos: bool = True,
    prepend_bos: bool = False,
    eos_token: str | None = None,
    bos_token: str | None = None,
) -> TokenizerSpec:
    """Load `source` ("bundled", a tokenizer folder or a tokenizer.json) into a worker spec."""
    path = BUNDLED_PATH if source == BUNDLED else Path(source)
    if not path.exists():
        raise TokenizerLoadError(
            f"tokenizer {source!r} not found (give a folder or a tokenizer.json)"
        )
    tok = _load_transformers_tokenizer(path)
    eos_id = _special_id(tok, "eos_token_id", _CONVENTIONAL_EOS, eos_token)
    bos_id = _special_id(tok, "bos_token_id", _CONVENTIONAL_BOS, bos_token)
    if append_eos and eos_id is None:
        raise TokenizerLoadError(
            f"tokenizer {source!r} has no EOS token, so --append-eos cannot work: "
            "name one with --eos-token TOKEN or pass --no-append-eos"
        )
    if prepend_bos and bos_id is None:
        raise TokenizerLoadError(
            f"tokenizer {source!r} has no BOS token, so --prepend-bos cannot work: name one with --bos-token TOKEN"
        )
    backend_json = tok.backend_tokenizer.to_str()
    fingerprint = "sha256:" + hashlib.sha256(backend_json.encode("utf-8")).hexdigest()
    _LOADED_BACKENDS[fingerprint] = tok.backend_tokenizer
    # len(tok) counts added tokens; the max id guards against vocabularies with holes.
    vocab_size = max(len(tok), max(tok.get_vocab().values(), default=-1) + 1)
    if source == BUNDLED:
        name = BUNDLED_NAME
    else:
        name = path.name if path.is_dir() else (path.parent.name or path.name)
    return TokenizerSpec(
        name=name,
        backend_json=backend_json,
        fingerprint=fingerprint,
        vocab_size=vocab_size,
        eos_id=eos_id,
        bos_id=bos_id,
        append_eos=append_eos,
        prepend_bos=prepend_bos,
    )


class BatchEncoder:
    """Encodes lists of texts into one flat token array plus per-document sizes.

    Built from a :class:`TokenizerSpec` inside each worker; never uses the Rust thread pool
    (each worker process is one core's worth of work, and the pool would oversubscribe).
    """

    def __init__(self, spec: TokenizerSpec):
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        from tokenizers import Tokenizer

        self.spec = spec
        self.dtype = spec.dtype
        inherited = _LOADED_BACKENDS.get(spec.fingerprint)
        self._tokenizer = (
            inherited if inherited is not None else Tokenizer.from_str(spec.backend_json)
        )
        encode = getattr(self._tokenizer, "encode_batch_fast", None)  # tokenizers >= 0.20
        self._encode = encode or self._tokenizer.encode_batch
        self._bos = spec.bos_id if spec.prepend_bos else None
        self._eos = spec.eos_id if spec.append_eos else None

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Return (tokens, sizes): documents concatenated, with BOS/EOS added as configured."""
        ids = [enc.ids for enc in self._encode(texts, add_special_tokens=False)]
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        body = np.fromiter(
            itertools.chain.from_iterable(ids), dtype=self.dtype, count=int(lengths.sum())
        )
        extra = (self._bos is not None) + (self._eos is not None)
        if extra == 0:
            return body, lengths.astype(np.int32)
        sizes = lengths + extra
        ends = np.cumsum(sizes)
        starts = ends - sizes
        out = np.empty(int(ends[-1]) if len(ends) else 0, dtype=self.dtype)
        special = np.zeros(out.size, dtype=bool)
        if self._bos is not None:
            out[starts] = self._bos
            special[starts] = True
        if self._eos is not None:
            out[ends - 1] = self._eos
            special[ends - 1] = True
        out[~special] = body
        return out, sizes.astype(np.int32)
