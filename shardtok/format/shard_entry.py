"""One shard's entry in the manifest (index.json's ``shards``, a row of index.compact)."""

from __future__ import annotations

from dataclasses import dataclass

from shardtok.errors import CorruptShardError
from shardtok.format.validate import want_int, want_plain_name, want_sha256


@dataclass(frozen=True)
class ShardEntry:
    file: str
    bytes: int
    num_documents: int
    num_tokens: int
    sha256: str
    # The shard json's own meta_sha256 (added in 0.2): lets a reader tie the shard it opened to
    # this entry from the head alone. None for manifests written before, which then get the
    # weaker checks (key, counts, dtype, vocabulary, tokenizer).
    meta_sha256: str | None = None
    # Tokens whose loss mask is 1 (masked datasets only, added in 0.2); None without masks.
    trained_tokens: int | None = None

    def to_json(self) -> dict:
        doc = {
            "bytes": self.bytes,
            "file": self.file,
            "num_documents": self.num_documents,
            "num_tokens": self.num_tokens,
            "sha256": self.sha256,
        }
        if self.meta_sha256 is not None:
            doc["meta_sha256"] = self.meta_sha256
        if self.trained_tokens is not None:
            doc["trained_tokens"] = self.trained_tokens
        return doc

    @classmethod
    def from_json(cls, doc, fail) -> ShardEntry:
        if not isinstance(doc, dict):
            raise fail(f"a shard entry is {doc!r}, not an object")
        file = want_plain_name(doc, "file", fail)

        def fail_here(reason: str) -> CorruptShardError:
            return fail(f"shard {file}: {reason}")

        entry = cls(
            file,
            want_int(doc, "bytes", fail_here),
            want_int(doc, "num_documents", fail_here),
            want_int(doc, "num_tokens", fail_here),
            want_sha256(doc, "sha256", fail_here),
            want_sha256(doc, "meta_sha256", fail_here) if "meta_sha256" in doc else None,
            want_int(doc, "trained_tokens", fail_here) if "trained_tokens" in doc else None,
        )
        if entry.trained_tokens is not None and entry.trained_tokens > entry.num_tokens:
            raise fail_here(f"{entry.trained_tokens} trained tokens of {entry.num_tokens}")
        return entry
