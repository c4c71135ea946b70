"""Builds GPT-2's byte-level BPE tokenizer from a folder of only vocab.json and merges.txt."""

from __future__ import annotations

import json
from pathlib import Path


class FolderError(Exception):
    """The folder cannot be built; tokenizer.py raises it as TokenizerLoadError with this message
    (importing that class from there would be an import cycle)."""


_BPE_FILES = ("vocab.json", "merges.txt")
_SPECIAL_KEYS = (
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
)  # fmt: skip
_ADDED_FLAGS = ("lstrip", "rstrip", "single_word", "normalized", "special")


def _names_a_class(path: Path) -> bool:
    """Whether transformers can tell which tokenizer class the folder holds: then AutoTokenizer
    builds it (a CLIP vocab.json and merges.txt are not GPT-2's); without, it refuses the folder."""
    return "tokenizer_class" in _folder_json(path, "tokenizer_config.json") or (
        (path / "config.json").is_file()
    )


def _folder_json(path: Path, name: str) -> dict:
    try:
        data = json.loads((path / name).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise FolderError(f"cannot read {path / name}: {exc}") from None
    if not isinstance(data, dict):
        raise FolderError(f"{path / name} is not a JSON object")
    return data


def applies(path: Path) -> bool:
    """Whether `path` is a folder with neither tokenizer.json nor a tokenizer class named, which
    transformers refuses: build() loads it, or names the files it lacks."""
    return path.is_dir() and not (path / "tokenizer.json").exists() and not _names_a_class(path)


def build(path: Path):
    """GPT-2's tokenizer from a folder of vocab.json and merges.txt alone, which transformers 5
    cannot load without a tokenizer class named (it asks for sentencepiece or tiktoken): a
    byte-level BPE as GPT2Tokenizer builds it, with the folder's special and added tokens and
    <|endoftext|> special where the vocabulary has it (GPT2Tokenizer's default)."""
    missing = [n for n in _BPE_FILES if not (path / n).is_file()]
    if missing:
        raise FolderError(
            f"cannot load tokenizer from {path}: it has no tokenizer.json and no "
            f"{' or '.join(missing)} (a tokenizer folder needs tokenizer.json, or "
            "vocab.json and merges.txt of a GPT-2 style BPE)"
        )
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab_file, merges_file = (str(path / n) for n in _BPE_FILES)
    try:
        vocab, merges = models.BPE.read_file(vocab_file, merges_file)
    except Exception as exc:  # tokenizers raises a bare Exception for a malformed file
        raise FolderError(f"cannot read {vocab_file} / {merges_file}: {exc}") from None
    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    for pair in merges:
        foreign = next((c for c in "".join(pair) if c not in alphabet), None)
        if foreign is not None:  # a SentencePiece BPE (▁ is no byte's character): built as
            # GPT-2's it would give wrong ids without a word of warning
            raise FolderError(
                f"{merges_file} is not a byte-level (GPT-2 style) BPE: merge {' '.join(pair)!r} "
                f"has {foreign!r}; give the folder its tokenizer.json"
            )
    config = _folder_json(path, "tokenizer_config.json")
    special_map = _folder_json(path, "special_tokens_map.json")
    added_ids = _folder_json(path, "added_tokens.json")
    backend = Tokenizer(models.BPE(vocab, merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(
        add_prefix_space=bool(config.get("add_prefix_space", False))
    )
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)

    # content -> [id or None, AddedToken flags]; tokenizer_config.json first,
    # special_tokens_map.json over it, as transformers merges them.
    tokens: dict[str, list] = {}
    named: dict[str, str] = {}

    def add(value, token_id=None, special=True):
        content = value.get("content") if isinstance(value, dict) else value
        if not isinstance(content, str) or not content:
            return None
        entry = tokens.setdefault(content, [None, {"special": special, "normalized": False}])
        if token_id is not None:
            entry[0] = int(token_id)
        if isinstance(value, dict):
            entry[1].update((k, bool(value[k])) for k in _ADDED_FLAGS if k in value)
        elif special:
            entry[1]["special"] = True
        return content

    try:
        if "<|endoftext|>" in vocab:
            add("<|endoftext|>")
        for content, token_id in added_ids.items():
            add(content, token_id, special=False)
        for token_id, value in (config.get("added_tokens_decoder") or {}).items():
            add(value, token_id)
        for source in (config, special_map):
            for key in _SPECIAL_KEYS:
                content = add(source.get(key))
                if content is not None:
                    named[key] = content
            extra = source.get("additional_special_tokens") or source.get("extra_special_tokens")
            for value in extra.values() if isinstance(extra, dict) else extra or ():
                add(value)
    except (TypeError, ValueError, AttributeError) as exc:
        raise FolderError(f"{path}: an added or special token is malformed: {exc}") from None
    # Tokens with a stated id go in id order, each checked to land there; the others after.
    order = sorted(tokens.items(), key=lambda kv: (kv[1][0] is None, kv[1][0] or 0))
    for content, (token_id, flags) in order:
        backend.add_tokens([AddedToken(content, **flags)])
        got = backend.token_to_id(content)
        if token_id is not None and got != token_id:
            raise FolderError(
                f"{path}: added token {content!r} is id {token_id} in the folder's files but "
                f"lands on id {got} after vocab.json's {len(vocab)} tokens"
            )
    return PreTrainedTokenizerFast(tokenizer_object=backend, **named)
