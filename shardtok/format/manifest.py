"""`index.json`: the dataset manifest. Planning (epoch plans, equal work per rank) reads only this."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from shardtok.errors import CorruptShardError
from shardtok.format.mmidx import token_dtype

MANIFEST_NAME = "index.json"
DATASET_FORMAT = "shardtok-dataset"
DATASET_FORMAT_VERSION = 1


@dataclass(frozen=True)
class ShardEntry:
    file: str
    bytes: int
    num_documents: int
    num_tokens: int
    sha256: str

    def to_json(self) -> dict:
        return {
            "bytes": self.bytes,
            "file": self.file,
            "num_documents": self.num_documents,
            "num_tokens": self.num_tokens,
            "sha256": self.sha256,
        }


@dataclass(frozen=True)
class Manifest:
    name: str
    dtype: np.dtype
    vocab_size: int
    tokenizer: dict
    shards: tuple[ShardEntry, ...]
    extra: dict = field(default_factory=dict)

    @property
    def num_documents(self) -> int:
        return sum(s.num_documents for s in self.shards)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.shards)

    @property
    def num_bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    @property
    def tokenizer_fingerprint(self) -> str | None:
        return self.tokenizer.get("fingerprint")

    def to_bytes(self) -> bytes:
        doc = {
            "dtype": self.dtype.name,
            "extra": self.extra,
            "format": DATASET_FORMAT,
            "format_version": DATASET_FORMAT_VERSION,
            "name": self.name,
            "num_documents": self.num_documents,
            "num_tokens": self.num_tokens,
            "shards": [s.to_json() for s in self.shards],
            "tokenizer": self.tokenizer,
            "vocab_size": self.vocab_size,
        }
        return (json.dumps(doc, sort_keys=True, indent=1, ensure_ascii=True) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Manifest:
        def fail(reason: str) -> CorruptShardError:
            return CorruptShardError(where, None, None, reason)

        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise fail(f"manifest is not valid JSON ({exc})") from None
        if not isinstance(doc, dict) or doc.get("format") != DATASET_FORMAT:
            raise fail("not a shardtok dataset manifest")
        if doc.get("format_version") != DATASET_FORMAT_VERSION:
            raise fail(
                f"manifest version {doc.get('format_version')} is not supported (reads {DATASET_FORMAT_VERSION})"
            )
        try:
            shards = tuple(
                ShardEntry(
                    str(s["file"]),
                    int(s["bytes"]),
                    int(s["num_documents"]),
                    int(s["num_tokens"]),
                    str(s["sha256"]),
                )
                for s in doc["shards"]
            )
            manifest = cls(
                name=str(doc["name"]),
                dtype=token_dtype(doc["dtype"]),
                vocab_size=int(doc["vocab_size"]),
                tokenizer=dict(doc.get("tokenizer") or {}),
                shards=shards,
                extra=dict(doc.get("extra") or {}),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise fail(f"manifest field missing or malformed: {exc!r}") from None
        for key, value in (
            ("num_documents", manifest.num_documents),
            ("num_tokens", manifest.num_tokens),
        ):
            if key in doc and doc[key] != value:
                raise fail(f"{key} is {doc[key]} but the shards add up to {value}")
        if len({s.file for s in shards}) != len(shards):
            raise fail("a shard is listed twice")
        return manifest

    def write(self, folder: str | Path) -> Path:
        """Write atomically: readers never see a half-written manifest."""
        path = Path(folder) / MANIFEST_NAME
        tmp = path.with_name(f".{MANIFEST_NAME}.tmp-{os.getpid()}")
        with open(tmp, "wb") as out:
            out.write(self.to_bytes())
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
        return path


def load_manifest(folder: str | Path) -> Manifest:
    path = Path(folder) / MANIFEST_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CorruptShardError(
            str(path), None, None, "no dataset manifest here (is this a shardtok dataset folder?)"
        ) from None
    return Manifest.from_bytes(data, str(path))
