"""Loading a Hugging Face tokenizer for conversion (``encoder.py`` turns text batches into token
arrays with what this loads).

Loading goes through ``transformers`` (it knows tokenizer folders, added tokens and special-token
maps for 4.x and 5.x), but the workers only need the Rust ``tokenizers`` backend: the spec handed
to them is the backend's serialized JSON, which is also what the fingerprint hashes. Encoding with
the backend directly skips the Python dicts that ``tokenizer(texts)["input_ids"]`` builds
(benchmarks/bench_convert.py measures the difference).

Nothing here downloads: every transformers call is given ``local_files_only=True`` or a file
path, so no environment variable has to be set in the caller's process (none is read or written).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shardtok.convert.tokenizing import bpe_folder
from shardtok.errors import ShardtokError
from shardtok.format.mmidx import dtype_for_vocab

BUNDLED = "bundled"
BUNDLED_PATH = Path(__file__).resolve().parents[2] / "assets" / "tokenizer"
BUNDLED_NAME = "shardtok-bpe-8k"

# Tried in order when a bare tokenizer.json names no EOS/BOS (it has no tokenizer_config.json).
_CONVENTIONAL_EOS = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eot_id|>", "[SEP]")
_CONVENTIONAL_BOS = ("<|begin_of_text|>", "<s>", "<bos>", "<|bos|>", "[CLS]")
# The eos_token of a chat model's tokenizer ends a turn, not a document: Qwen's instruct
# tokenizers name <|im_end|>, Llama 3 Instruct's <|eot_id|>, while their pretraining separated
# documents with <|endoftext|> / <|end_of_text|>. Appending the turn end to every pretraining
# document is rarely what was meant, but it is what this tokenizer says, so it stays the rule
# (changing it would change existing users' bytes) and a note names the alternative.
_CHAT_TURN_ENDS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|end|>")
_DOCUMENT_ENDS = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")


# Rust tokenizers already built in this process, by fingerprint. Forked workers inherit them and
# skip re-parsing the JSON (0.5 s of CPU per worker for a 128k-entry vocabulary).
_LOADED_BACKENDS: dict[str, object] = {}
# tiktoken encodings that passed the gate in this process, by fingerprint (inherited the same way).
_LOADED_TIKTOKEN: dict[str, object] = {}
# The tiktoken gate's verdicts in this process, by fingerprint: None passed, else why not. Kept
# apart from _LOADED_TIKTOKEN, which a worker also fills from a plan's word without a gate.
_GATE_VERDICTS: dict[str, str | None] = {}

BACKENDS = ("auto", "hf", "tiktoken")


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
    # "hf" (tokenizers' encode_batch_fast) or "tiktoken" (same ids, checked: see
    # tiktoken_backend.py). Not part of as_metadata(): the shards do not depend on it.
    backend: str = "hf"
    backend_note: str = ""  # why this backend (say, which condition tiktoken failed)
    # The strings of eos_id/bos_id and where each choice came from (say, "--eos-token"), for
    # the summary; in the plan, but neither in the manifest nor in the fingerprint (the ids are).
    eos_token: str | None = None
    bos_token: str | None = None
    eos_source: str = ""
    bos_source: str = ""
    # A note for the user about the EOS choice (a chat-turn end where the tokenizer also has a
    # document end), or "".
    eos_note: str = ""

    @property
    def dtype(self) -> np.dtype:
        return dtype_for_vocab(self.vocab_size)

    def special_tokens_summary(self) -> str:
        """Two summary lines: which EOS and BOS ids this spec adds, their strings, and why."""
        return "\n".join(
            (
                _special_line("eos", "after", self.append_eos, "--no-append-eos", self.eos_id,
                              self.eos_token, self.eos_source),
                _special_line("bos", "before", self.prepend_bos, "--prepend-bos is off",
                              self.bos_id, self.bos_token, self.bos_source),
            )
        )  # fmt: skip

    def as_metadata(self) -> dict:
        """The tokenizer description stored in every shard and in the manifest."""
        return {
            "name": self.name,
            "fingerprint": self.fingerprint,
            "eos_id": self.eos_id,
            "bos_id": self.bos_id,
        }


def _load_transformers_tokenizer(path: Path):
    try:
        if bpe_folder.applies(path):
            return bpe_folder.build(path)
    except bpe_folder.FolderError as exc:
        raise TokenizerLoadError(str(exc)) from None
    from transformers import PreTrainedTokenizerFast  # 1 s import: only here

    try:
        if path.is_dir() and (path / "tokenizer.json").exists():
            # tokenizer.json is the serialized truth; PreTrainedTokenizerFast reads it together
            # with tokenizer_config.json/special_tokens_map.json, and unlike AutoTokenizer it does
            # not import torch (2+ s) on the way.
            tok = PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)
        elif path.is_dir():
            from transformers import AutoTokenizer  # the named class knows its files

            tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True, use_fast=True)
        else:
            tok = PreTrainedTokenizerFast(tokenizer_file=str(path))  # a file: no hub lookup
    except Exception as exc:  # transformers raises many types (OSError, ValueError, KeyError...)
        reason = " ".join(str(exc).split())  # its messages span lines; an error here is one
        raise TokenizerLoadError(f"cannot load tokenizer from {path}: {reason}") from exc
    if not getattr(tok, "is_fast", False) or getattr(tok, "backend_tokenizer", None) is None:
        raise TokenizerLoadError(
            f"{path}: only fast (Rust `tokenizers`) tokenizers are supported; "
            "this folder has no tokenizer.json"
        )
    return tok


def _special_line(
    kind: str,
    where: str,
    added: bool,
    off: str,
    token_id: int | None,
    token: str | None,
    source: str,
) -> str:
    named = "none" if token_id is None else f"{token!r} (id {token_id})"
    if added:
        return f"  {kind}         {named} {where} every document ({source})"
    if token_id is None:
        return f"  {kind}         not added ({off}); the tokenizer names none"
    return f"  {kind}         not added ({off}); the tokenizer's is {token!r} (id {token_id}, {source})"


def _configured_in(path: Path, key: str, token: str) -> str:
    """Which of the folder's files names `token` as `key` (transformers merges them)."""
    if path.is_dir():
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            try:
                value = json.loads((path / name).read_text(encoding="utf-8")).get(key)
            except (OSError, ValueError, AttributeError):
                continue
            if isinstance(value, dict):  # a serialized AddedToken
                value = value.get("content")
            if value == token:
                return f"from {key} in {name}"
    return f"from the tokenizer class's default {key}"


def _special(
    tok,
    path: Path,
    vocab: dict[str, int],
    kind: str,
    conventional: tuple[str, ...],
    explicit: str | None,
) -> tuple[int | None, str | None, str]:
    """(id, string, where the choice came from) of the tokenizer's EOS or BOS (`kind`)."""
    if explicit is not None:
        if explicit not in vocab:
            raise TokenizerLoadError(
                f"--{kind}-token {explicit!r} is not in the tokenizer's vocabulary"
            )
        return int(vocab[explicit]), explicit, f"from --{kind}-token"
    token = getattr(tok, f"{kind}_token", None)
    token_id = getattr(tok, f"{kind}_token_id", None)
    if token_id is not None:
        return int(token_id), str(token), _configured_in(path, f"{kind}_token", str(token))
    # A bare tokenizer.json carries no eos/bos configuration; its added special tokens do.
    added = {
        t.content for t in tok.backend_tokenizer.get_added_tokens_decoder().values() if t.special
    }
    for candidate in conventional:
        if candidate in added:
            return (
                int(vocab[candidate]), candidate,
                f"no {kind}_token configured: the first special token of "
                f"{', '.join(conventional)}",
            )  # fmt: skip
    return None, None, f"no {kind}_token configured and no special token named like one"


def _eos_note(vocab: dict[str, int], eos_token: str | None, source: str) -> str:
    if eos_token not in _CHAT_TURN_ENDS or source.startswith("from --"):
        return ""
    document_end = next((t for t in _DOCUMENT_ENDS if t in vocab), None)
    if document_end is None:
        return ""
    return (
        f"note: EOS is {eos_token!r} (id {vocab[eos_token]}, {source}), which ends a chat "
        f"turn; pretraining text usually ends documents with {document_end!r} "
        f"(id {vocab[document_end]}): pass --eos-token '{document_end}' for that"
    )


def load_tokenizer(
    source: str,
    *,
    append_eos: bool = True,
    prepend_bos: bool = False,
    eos_token: str | None = None,
    bos_token: str | None = None,
    backend: str = "auto",
    cache_dir: str | os.PathLike | None = None,
) -> TokenizerSpec:
    """Load `source` ("bundled", a tokenizer folder or a tokenizer.json) into a worker spec.

    `backend`: "hf" encodes with tokenizers; "tiktoken" with tiktoken, or TokenizerLoadError
    naming the condition the tokenizer fails; "auto" takes tiktoken when it qualifies.
    `cache_dir`: where the tiktoken gate keeps its verdicts by fingerprint
    (CACHE_DIR/tiktoken-gate/); None keeps nothing on disk and runs the merge checks every time.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    path = BUNDLED_PATH if source == BUNDLED else Path(source)
    if not path.exists():
        raise TokenizerLoadError(
            f"tokenizer {source!r} not found (give a folder or a tokenizer.json)"
        )
    tok = _load_transformers_tokenizer(path)
    vocab = tok.get_vocab()  # 0.13 s for a 128k vocabulary: asked once
    eos_id, eos_string, eos_source = _special(tok, path, vocab, "eos", _CONVENTIONAL_EOS, eos_token)
    bos_id, bos_string, bos_source = _special(tok, path, vocab, "bos", _CONVENTIONAL_BOS, bos_token)
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
    vocab_size = max(len(tok), max(vocab.values(), default=-1) + 1)
    if source == BUNDLED:
        name = BUNDLED_NAME
    else:
        name = path.name if path.is_dir() else (path.parent.name or path.name)
    chosen, note = _choose_backend(
        backend, tok.backend_tokenizer, backend_json, fingerprint, cache_dir
    )
    return TokenizerSpec(
        name=name,
        backend_json=backend_json,
        fingerprint=fingerprint,
        vocab_size=vocab_size,
        eos_id=eos_id,
        bos_id=bos_id,
        append_eos=append_eos,
        prepend_bos=prepend_bos,
        backend=chosen,
        backend_note=note,
        eos_token=eos_string,
        bos_token=bos_string,
        eos_source=eos_source,
        bos_source=bos_source,
        eos_note=_eos_note(vocab, eos_string, eos_source) if append_eos else "",
    )


def _choose_backend(
    requested: str, hf_backend, backend_json: str, fingerprint: str, cache_dir=None
) -> tuple[str, str]:
    """Run the tiktoken gate (once, here in the main process) and return (backend, note)."""
    if requested == "hf":
        return "hf", "requested with --tokenizer-backend hf"
    # The verdict depends on the serialized tokenizer alone, which the fingerprint hashes: a
    # process that loads the same tokenizer again (a notebook, a test suite) skips the gate,
    # unless a cache_dir asks for the verdict to be kept there.
    known = _GATE_VERDICTS.get(fingerprint, "") if cache_dir is None else ""
    if known == "" or (known is None and fingerprint not in _LOADED_TIKTOKEN):
        try:
            encoding = tiktoken_encoding(hf_backend, backend_json, fingerprint, cache_dir)
        except TokenizerLoadError as exc:
            _GATE_VERDICTS[fingerprint] = str(exc)
        else:
            _LOADED_TIKTOKEN[fingerprint] = encoding
            _GATE_VERDICTS[fingerprint] = None
    refused = _GATE_VERDICTS[fingerprint]
    if refused is not None:
        if requested == "tiktoken":
            raise TokenizerLoadError(f"--tokenizer-backend tiktoken cannot be used: {refused}")
        return "hf", f"tiktoken not used: {refused}"
    return "tiktoken", "same ids as tokenizers: equivalence gate passed, canary on every unit"


def tiktoken_encoding(hf_backend, backend_json: str, fingerprint: str, cache_dir=None):
    """A tiktoken Encoding giving hf_backend's ids, or TokenizerLoadError saying why not.

    `cache_dir` as in :func:`load_tokenizer`.
    """
    from shardtok.convert.tokenizing import tiktoken_backend as tb
    from shardtok.convert.tokenizing.nfc_text import NfcText
    from shardtok.convert.tokenizing.probe import probe_texts

    try:
        import tiktoken  # noqa: F401
    except ImportError:
        raise TokenizerLoadError("tiktoken is not installed") from None
    try:
        parts = tb.check(backend_json, fingerprint, cache_dir=cache_dir)
    except tb.NotEquivalent as exc:
        raise TokenizerLoadError(str(exc)) from None
    encoding = parts.build(fingerprint)
    # The gate reads the configuration; the probe checks the regex engines and BPE agree in
    # fact on a fixed text, before any worker starts.
    texts = probe_texts(parts.specials)
    # One text at a time: encode_batch would start tokenizers' thread pool in this process just
    # before the workers are forked from it.
    hf = [hf_backend.encode(t, add_special_tokens=False).ids for t in texts]
    allowed = frozenset(parts.specials)
    # Through HF's NFC step where the tokenizer has one, as the workers encode.
    nfc = NfcText(encoding, parts.specials) if parts.nfc else None
    for text, expected in zip(texts, hf):
        got = nfc.ids(text) if nfc is not None else None
        if got is None:
            got = encoding.encode(text, allowed_special=allowed, disallowed_special=())
        if got != expected:
            raise TokenizerLoadError(
                f"the probe text encodes differently ({describe_mismatch(expected, got)})"
            )
    return encoding


def describe_mismatch(hf_ids: list[int], tiktoken_ids: list[int], context: int = 12) -> str:
    """Where two id lists part, with both prefixes up to a few ids past that point."""
    at = next(
        (i for i, (a, b) in enumerate(zip(hf_ids, tiktoken_ids)) if a != b),
        min(len(hf_ids), len(tiktoken_ids)),
    )
    start = max(0, at - 4)
    return (
        f"ids differ at position {at} of {len(hf_ids)} (hf) / {len(tiktoken_ids)} (tiktoken): "
        f"hf [{start}:] = {hf_ids[start : at + context]}, "
        f"tiktoken [{start}:] = {tiktoken_ids[start : at + context]}"
    )
