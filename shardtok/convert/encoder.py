"""Encoding text batches into token arrays inside a convert worker, with the backend a
``TokenizerSpec`` names (``tokenizer.py`` loads and checks it): tiktoken where the equivalence
gate passed (arrays without Python lists on tiktoken >= 0.9, a canary against tokenizers), else
the Rust ``tokenizers`` backend one text per call.
"""

from __future__ import annotations

import itertools

import numpy as np

from shardtok.convert.tokenizer import (
    _LOADED_BACKENDS,
    _LOADED_TIKTOKEN,
    TokenizerSpec,
    describe_mismatch,
)


class BatchEncoder:
    """Encodes lists of texts into one flat token array plus per-document sizes.

    Built from a :class:`TokenizerSpec` inside each worker. With the tiktoken backend,
    :meth:`canary` re-encodes a text with tokenizers to compare.
    """

    def __init__(self, spec: TokenizerSpec):
        from tokenizers import Tokenizer

        self.spec = spec
        self.dtype = spec.dtype
        inherited = _LOADED_BACKENDS.get(spec.fingerprint)
        self._tokenizer = (
            inherited if inherited is not None else Tokenizer.from_str(spec.backend_json)
        )
        self._hf_encode = self._tokenizer.encode
        self._encode_ids = self._hf_ids
        # text -> uint32 id array without a Python list in between (see _array_encoder);
        # None: only lists (tokenizers, or tiktoken < 0.9).
        self._encode_array = None
        if spec.backend == "tiktoken":
            self._init_tiktoken(spec)
        self._bos = spec.bos_id if spec.prepend_bos else None
        self._eos = spec.eos_id if spec.append_eos else None

    def _init_tiktoken(self, spec: TokenizerSpec) -> None:
        encoding = _LOADED_TIKTOKEN.get(spec.fingerprint)
        if encoding is None:  # a spawned worker: the parent's gate passed, only build
            from shardtok.convert.tiktoken_backend import parts_unchecked

            encoding = parts_unchecked(spec.backend_json).build(spec.fingerprint)
            _LOADED_TIKTOKEN[spec.fingerprint] = encoding
        self._tiktoken = encoding
        specials = frozenset(encoding.special_tokens_set)
        # HF cuts documents at added-token text even with add_special_tokens=False, so texts
        # that may hold one go through encode() with every added token allowed. Most texts
        # cannot (they lack the tokens' first characters) and take the cheaper encode_ordinary,
        # which skips converting the allowed set for every call.
        firsts = sorted({t[0] for t in specials})
        ordinary, full = encoding.encode_ordinary, encoding.encode
        if not specials:
            self._encode_one = ordinary
        elif len(firsts) <= 4:

            def encode_one(text: str) -> list[int]:
                for ch in firsts:
                    if ch in text:
                        return full(text, allowed_special=specials, disallowed_special=())
                return ordinary(text)

            self._encode_one = encode_one
        else:
            self._encode_one = lambda text: full(
                text, allowed_special=specials, disallowed_special=()
            )
        self._encode_ids = self._tiktoken_ids
        if hasattr(encoding, "encode_to_numpy"):  # tiktoken >= 0.9
            self._encode_array = _array_encoder(encoding, specials, firsts, self._encode_one)

    def encode_ids(self, texts: list[str]) -> list[list[int]]:
        """Each text's ids with this spec's backend, without BOS/EOS (benchmarks use it)."""
        return self._encode_ids(texts)

    def encode_arrays(self, texts: list[str]) -> list:
        """Each text's ids as an array where the backend can give one without building a list
        (tiktoken >= 0.9), else as a list; without BOS/EOS. What :meth:`encode` starts from, and
        the benchmark's tokenizer ceiling."""
        if self._encode_array is None:
            return self._encode_ids(texts)
        return list(map(self._encode_array, texts))

    def _hf_ids(self, texts: list[str]) -> list[list[int]]:
        # One text per call, never encode_batch(_fast): the batch calls start tokenizers' Rust
        # thread pool (one thread per core in every worker: cores x workers threads, and a pool
        # that a later fork of this process must not inherit). Its only off switch is the
        # TOKENIZERS_PARALLELISM environment variable, which is the caller's, not ours. Single
        # calls stay on this thread; they cost ~9% more CPU than a serial encode_batch_fast
        # (they compute offsets), on the hf backend only.
        encode = self._hf_encode
        return [encode(text, add_special_tokens=False).ids for text in texts]

    def _tiktoken_ids(self, texts: list[str]) -> list[list[int]]:
        return list(map(self._encode_one, texts))

    def canary(self, text: str) -> str | None:
        """None if both backends give `text` the same ids, else where they differ."""
        if self.spec.backend != "tiktoken":
            return None
        # The encoder that makes the tokens: the array path where there is one.
        if self._encode_array is not None:
            fast = self._encode_array(text).tolist()
        else:
            fast = self._encode_one(text)
        hf = self._hf_ids([text])[0]
        return None if hf == fast else describe_mismatch(hf, fast)

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Return (tokens, sizes): documents concatenated, with BOS/EOS added as configured."""
        if self._encode_array is not None:
            return self._encode_from_arrays(texts)
        return self._encode_from_lists(texts)

    def _encode_from_arrays(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        # Building tiktoken's id lists and converting them cost 0.19 s of 0.79 s of CPU per
        # 3.7 M Llama 3 tokens; arrays need one concatenate, into which the BOS/EOS ids go as
        # one-element arrays between the documents.
        arrays = list(map(self._encode_array, texts))
        sizes = np.fromiter(map(len, arrays), dtype=np.int32, count=len(arrays))
        pieces = arrays
        if self._bos is not None or self._eos is not None:
            marks = [
                np.array([m], dtype=np.uint32) for m in (self._bos, self._eos) if m is not None
            ]
            step = 1 + len(marks)
            pieces = [None] * (step * len(arrays))
            at = 0
            if self._bos is not None:
                pieces[0::step] = [marks[0]] * len(arrays)
                at = 1
            pieces[at::step] = arrays
            if self._eos is not None:
                pieces[at + 1 :: step] = [marks[-1]] * len(arrays)
            sizes += len(marks)
        if not pieces:
            return np.empty(0, dtype=self.dtype), sizes
        # Ids are below the vocabulary size, which the dtype was chosen to hold.
        return np.concatenate(pieces, dtype=self.dtype, casting="unsafe"), sizes

    def _encode_from_lists(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        ids = self._encode_ids(texts)
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


def _array_encoder(encoding, specials: frozenset, firsts: list[str], encode_one):
    """text -> uint32 array of `encoding`'s ids, by the rule of BatchEncoder's encode_one: every
    added token allowed where the text may hold one (all of them when they start with more than
    four different characters), none otherwise -- tiktoken's encode with nothing allowed and
    nothing disallowed is encode_ordinary."""
    to_numpy = encoding.encode_to_numpy
    nothing: frozenset = frozenset()
    few = len(firsts) <= 4

    def encode_array(text: str) -> np.ndarray:
        allowed = specials
        if few:
            allowed = nothing
            for ch in firsts:
                if ch in text:
                    allowed = specials
                    break
        try:
            return to_numpy(text, allowed_special=allowed, disallowed_special=())
        except UnicodeEncodeError:
            # A lone surrogate: tiktoken's list encoders replace it and retry, its numpy one
            # does not. Records never get here (the reader rejects such text).
            return np.asarray(encode_one(text), dtype=np.uint32)

    return encode_array
