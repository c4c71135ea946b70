"""Encoding text batches into token arrays inside a convert worker, with the backend a
``TokenizerSpec`` names (``tokenizer.py`` loads and checks it): tiktoken where the equivalence
gate passed (arrays without Python lists on tiktoken >= 0.9, a canary against tokenizers), else
the Rust ``tokenizers`` backend one text per call.

With tiktoken, a batch's documents are encoded in runs, joined by an added token (see
:class:`_Joiner`): one call per run instead of one per document. For a tokenizer with an NFC
normalizer (Qwen), a document that HF's NFC would change is encoded alone by
``nfc_text.NfcText``, as HF encodes it; the others (ASCII, or already NFC) as above.
"""

from __future__ import annotations

import itertools

import numpy as np

from shardtok.convert.tokenizing.tokenizer import (
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
        # Runs of texts in one call (see _Joiner); None: one call per text.
        self._joiner: _Joiner | None = None
        # HF's NFC step (nfc_text.NfcText); None: the tokenizer has no normalizer.
        self._nfc = None
        if spec.backend == "tiktoken":
            self._init_tiktoken(spec)
        self._bos = spec.bos_id if spec.prepend_bos else None
        self._eos = spec.eos_id if spec.append_eos else None

    def _init_tiktoken(self, spec: TokenizerSpec) -> None:
        encoding = _LOADED_TIKTOKEN.get(spec.fingerprint)
        if encoding is None:  # a spawned worker: the parent's gate passed, only build
            from shardtok.convert.tokenizing.tiktoken_backend import parts_unchecked

            encoding = parts_unchecked(spec.backend_json).build(spec.fingerprint)
            _LOADED_TIKTOKEN[spec.fingerprint] = encoding
        self._tiktoken = encoding
        specials = frozenset(encoding.special_tokens_set)
        from tokenizers import normalizers

        # The gate let tiktoken through with no normalizer or NFC alone.
        if isinstance(self._tokenizer.normalizer, normalizers.NFC):
            from shardtok.convert.tokenizing.nfc_text import NfcText

            ids = {t: encoding.encode_single_token(t) for t in specials}
            self._nfc = NfcText(encoding, ids)
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
        if self._nfc is not None:
            self._encode_one = _nfc_first(self._nfc, self._encode_one, list)
        self._encode_ids = self._tiktoken_ids
        if hasattr(encoding, "encode_to_numpy"):  # tiktoken >= 0.9
            self._encode_array = _array_encoder(encoding, specials, firsts, self._encode_one)
            if self._nfc is not None:
                self._encode_array = _nfc_first(self._nfc, self._encode_array, _uint32)
            self._joiner = _Joiner.for_encoding(encoding, specials)

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
        hf = self._hf_ids([text])[0]
        if self._nfc is not None:
            # A text NFC changes is encoded alone by NfcText (see _encode_joined): check that.
            normalized = self._nfc.ids(text)
            if normalized is not None:
                return None if hf == normalized else describe_mismatch(hf, normalized)
        # The encoder that makes the tokens: the joined runs where there are any (the text
        # twice over, so that a run of two is checked: each copy must give hf's ids), else the
        # array path where there is one.
        joined = None if self._joiner is None else self._joined_ids([text, text], self._joiner)
        if joined is not None:
            tokens, ends = joined
            first = int(ends[0])
            for fast in (tokens[:first].tolist(), tokens[first + 1 :].tolist()):
                if fast != hf:
                    return describe_mismatch(hf, fast)
            return None
        if self._encode_array is not None:
            fast = self._encode_array(text).tolist()
        else:
            fast = self._encode_one(text)
        return None if hf == fast else describe_mismatch(hf, fast)

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Return (tokens, sizes): documents concatenated, with BOS/EOS added as configured."""
        if self._joiner is not None:
            return self._encode_joined(texts, self._joiner)
        if self._encode_array is not None:
            return self._encode_from_arrays(texts)
        return self._encode_from_lists(texts)

    def _encode_joined(self, texts: list[str], joiner: _Joiner) -> tuple[np.ndarray, np.ndarray]:
        if not texts:
            return np.empty(0, dtype=self.dtype), np.empty(0, dtype=np.int32)
        # Texts that HF's NFC changes are encoded alone (by NfcText): found before joining,
        # since joined they would give the right count and the wrong ids.
        changed = self._nfc_changed(texts)
        if not changed:
            joined = self._joined_ids(texts, joiner)
            if joined is not None:
                return self._marked(*joined)
        # Texts holding the separator's own text: those alone, as _encode_from_arrays does,
        # the runs between them joined (one text at a time for a run that still cannot be).
        # None: a lone surrogate, and the batch goes one text at a time.
        holding = [i for i, text in enumerate(texts) if joiner.sep in text]
        if changed:
            holding = sorted({*holding, *changed})
        if not holding:
            return self._encode_from_arrays(texts)
        pieces: list[np.ndarray] = []
        sizes: list[np.ndarray] = []
        at = 0
        for alone in [*holding, len(texts)]:
            if alone > at:
                run = texts[at:alone]
                joined = self._joined_ids(run, joiner)
                tokens, run_sizes = (
                    self._encode_from_arrays(run) if joined is None else self._marked(*joined)
                )
                pieces.append(tokens)
                sizes.append(run_sizes)
            if alone < len(texts):
                tokens, one_size = self._encode_from_arrays(texts[alone : alone + 1])
                pieces.append(tokens)
                sizes.append(one_size)
            at = alone + 1
        return np.concatenate(pieces), np.concatenate(sizes)

    def _nfc_changed(self, texts: list[str]) -> list[int]:
        """Indices of the texts that HF's NFC step changes (none without an NFC normalizer)."""
        nfc = self._nfc
        if nfc is None:
            return []
        # isascii is O(1): a batch of ASCII documents costs one pass over the list.
        return [
            i for i, text in enumerate(texts) if not text.isascii() and nfc.ids(text) is not None
        ]

    def _joined_ids(
        self, texts: list[str], joiner: _Joiner
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """The texts' ids (in this encoder's dtype, writable) with the joiner's id between
        documents, and the separators' positions; None where the run cannot be joined."""
        ids = joiner.encode(texts)
        if ids is None:  # a lone surrogate
            return None
        # Ids are below the vocabulary size, which the dtype was chosen to hold.
        tokens = ids.astype(self.dtype, casting="unsafe")
        ends = np.flatnonzero(tokens == joiner.sep_id)
        # Another count: a text holds the separator's text (see _Joiner); the caller then
        # encodes such texts alone.
        return (tokens, ends) if ends.size == len(texts) - 1 else None

    def _marked(self, tokens: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Joined ids (a separator at each of `ends`) to documents with BOS/EOS as configured,
        and their sizes: each separator becomes EOS and/or BOS, in place where it is one."""
        bos, eos = self._bos, self._eos
        sizes = np.diff(ends, prepend=-1, append=tokens.size).astype(np.int32) - 1
        if bos is None and eos is None:
            return np.delete(tokens, ends), sizes
        if bos is None or eos is None:
            mark = eos if eos is not None else bos
            tokens[ends] = mark
            one = np.array([mark], dtype=self.dtype)
            return np.concatenate([tokens, one] if eos is not None else [one, tokens]), sizes + 1
        tokens[ends] = eos
        tokens = np.insert(tokens, ends + 1, bos)
        head, tail = np.array([bos], dtype=self.dtype), np.array([eos], dtype=self.dtype)
        return np.concatenate([head, tokens, tail]), sizes + 2

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


class _Joiner:
    """Encodes a run of documents in one tiktoken call, joined by an added token `sep`, with
    every added token allowed (as each document alone would be encoded).

    Why: each call costs ~3.5 us beside the BPE and hands the GIL back and forth once (the
    worker's writer thread then makes the tokenizing thread wait for it); most documents are
    short (the benchmark corpus: median 80 characters).

    Exact: tiktoken finds the added tokens first, leftmost first, and runs its regex and BPE on
    each piece between them alone (``CoreBPE::encode``: ``regex.find_iter(&text[start..end])``),
    so ``a + sep + b`` encodes as ``ids(a) + [sep] + ids(b)`` provided every added token found
    lies inside a document or is a separator. One found inside a document is what that document
    alone gives (it is allowed there too). None can start in a document and end past it: ending
    inside `sep` needs an added token that ends with a proper prefix of `sep`, which
    :meth:`for_encoding` rules out, and reaching past `sep` needs one that holds `sep`, which
    the gate rules out (no added token is a substring of another). So each separator is found
    where it was put, and its id comes out elsewhere only for a document holding `sep`'s text:
    then the count is off, and those documents are encoded alone. Nothing is checked per
    document on the way (a scan for added tokens' characters cost ~3% of a worker's
    tokenizing thread). BatchEncoder.canary checks a run of two against tokenizers.
    """

    def __init__(self, encoding, sep: str, specials: frozenset):
        self.sep = sep
        self.sep_id = encoding.encode_single_token(sep)
        self._to_numpy = encoding.encode_to_numpy
        self._allowed = specials

    @classmethod
    def for_encoding(cls, encoding, specials: frozenset) -> _Joiner | None:
        for sep in sorted(specials, key=encoding.encode_single_token):
            prefixes = [sep[:k] for k in range(1, len(sep))]
            if not any(s.endswith(p) for s in specials for p in prefixes):
                return cls(encoding, sep, specials)
        return None  # no added tokens, or none can stand between documents

    def encode(self, texts: list[str]) -> np.ndarray | None:
        """The joined texts' ids (uint32, read-only), or None for a lone surrogate."""
        try:
            return self._to_numpy(
                self.sep.join(texts), allowed_special=self._allowed, disallowed_special=()
            )
        except UnicodeEncodeError:
            return None


def _uint32(ids: list[int]) -> np.ndarray:
    return np.asarray(ids, dtype=np.uint32)


def _nfc_first(nfc, encode, wrap):
    """`encode` for texts HF's NFC leaves as they are, NfcText's ids (through `wrap`) else."""
    nfc_ids = nfc.ids

    def encode_nfc(text: str):
        if text.isascii():
            return encode(text)
        ids = nfc_ids(text)
        return encode(text) if ids is None else wrap(ids)

    return encode_nfc


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
