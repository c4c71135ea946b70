"""Fine-tuning test data: the reference note's Vicuna record and YAML, a tokenizer whose special
tokens the note and the ChatML built-in need, and reading a converted SFT dataset back."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from shardtok.convert.tokenizing.tokenizer import BUNDLED_PATH

# The reference note's record (its "# optional" comment made into the two keys it describes).
VICUNA = {
    "id": 0,
    "conversations": [
        {"from": "human", "value": "What is up?"},
        {"from": "gpt", "value": "Hello! How can I help you today?"},
        {"from": "human", "value": "Who are you?"},
        {
            "from": "gpt",
            "value": "You can call me Vicuna, and I was trained by Large Model Systems "
            "Organization (LMSYS) researchers as a language model.",
        },
        {"from": "human", "value": "Goodbye"},
        {
            "from": "gpt",
            "value": "Goodbye! If you have any more questions in the future, don't hesitate "
            "to ask.",
        },
    ],
    "instruction": "Role: Vicuna, trained by Large Model Systems Organization (LMSYS) researchers",
    "role": "Vicuna, trained by Large Model Systems Organization (LMSYS) researchers",
}

# The reference note's YAML, byte for byte as it writes it (no `format:` key).
NOTE_YAML = """\
special_tokens:
    bos_token: <s>
    eos_token: </s>

loss_masking_jq_patterns:
    - .conversations | select(.from == "human")
    - .instruction
    - .role

message_construction: [role, instruction, conversations]
"""

SPECIALS = ["<s>", "</s>", "<|im_start|>", "<|im_end|>"]


def chat(*pairs) -> list[dict]:
    """Messages from (role, content) pairs."""
    return [{"role": role, "content": content} for role, content in pairs]


# Conversations every template is checked on against transformers: a system message, several
# turns, non-ASCII, contents with leading and trailing whitespace, an empty answer.
CHATS = [
    chat(("user", "Hi"), ("assistant", "Hello! How can I help?")),
    chat(("system", "You are terse."), ("user", "2+2?"), ("assistant", "4"),
         ("user", "And 3+3?"), ("assistant", "6, obviously.")),
    chat(("user", "Ça va ? 日本語で"), ("assistant", "Très bien 🙂 — はい、日本語です。")),
    chat(("user", "\n leading"), ("assistant", "\n\nSure"), ("user", "again"),
         ("assistant", "  two spaces"), ("user", "x"), ("assistant", " Sure  ")),
    chat(("user", "say nothing"), ("assistant", "")),
]  # fmt: skip


def special_tokenizer(folder: Path) -> Path:
    """The bundled tokenizer plus SPECIALS as special tokens, saved as FOLDER/tokenizer.json."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(BUNDLED_PATH / "tokenizer.json"))
    tok.add_special_tokens(SPECIALS)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tokenizer.json"
    tok.save(str(path))
    return path


def write_jsonl(path: Path, records) -> Path:
    """Records as JSONL; a str record is written as the raw line (for broken lines)."""
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def documents(out: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    """(tokens, mask) of every document of the dataset in `out`, in order."""
    from shardtok.format import ShardReader
    from shardtok.format.manifest import load_manifest

    docs = []
    for shard in load_manifest(out).shards:
        for tokens, mask in ShardReader(out / shard.file).documents(with_masks=True):
            docs.append((np.asarray(tokens), np.asarray(mask)))
    return docs


def trained_runs(tokenizer_path: Path, tokens, mask) -> list[str]:
    """The decoded runs of consecutive trained tokens (special tokens shown)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    runs, current = [], []
    for token, on in zip(np.asarray(tokens).tolist(), np.asarray(mask).tolist()):
        if on:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return [tok.decode(r, skip_special_tokens=False) for r in runs]


def decoded_runs(backend, ids, mask) -> list[str]:
    """The trained runs of `ids` (consecutive tokens whose `mask` is set), each decoded by a
    tokenizers `backend` with its special tokens."""
    runs, run = [], []
    for token, flag in zip(ids, mask):
        if flag:
            run.append(token)
        elif run:
            runs, run = runs + [run], []
    runs += [run] if run else []
    return [backend.decode(r, skip_special_tokens=False) for r in runs]


def decode(tokenizer_path: Path, tokens) -> str:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    return tok.decode(np.asarray(tokens).tolist(), skip_special_tokens=False)


def dataset_bytes(out: Path) -> dict[str, bytes]:
    """Every file of a finished dataset (shards, index.json, rejects.jsonl), by name."""
    names = [p for p in sorted(out.iterdir()) if p.suffix == ".tar"]
    names += [out / n for n in ("index.json", "rejects.jsonl") if (out / n).exists()]
    return {p.name: p.read_bytes() for p in names}
