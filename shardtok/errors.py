"""The one family of errors shardtok raises for bad data, bad input and bad state.

Every error names where the problem is (file or URL, tar member, byte offset, input line), so a
user with a terabyte of shards can go straight to the bad one.
"""

from __future__ import annotations


class ShardtokError(Exception):
    """Base class of every error shardtok raises on purpose."""


class CorruptShardError(ShardtokError):
    """A shard, Megatron pair or manifest is damaged or disagrees with itself.

    Raised instead of ever returning wrong tokens.
    """

    def __init__(self, path: str, member: str | None, offset: int | None, reason: str):
        self.path = str(path)
        self.member = member
        self.offset = offset
        self.reason = reason
        where = self.path
        if member is not None:
            where += f", member {member}"
        if offset is not None:
            where += f", byte offset {offset}"
        super().__init__(f"{where}: {reason}")

    def __reduce__(self):
        # Errors cross process boundaries (DataLoader workers); pickle the constructor arguments.
        return (type(self), (self.path, self.member, self.offset, self.reason))


class BadRecordError(ShardtokError):
    """An input record cannot become a document (invalid JSON, missing field, empty text...)."""

    def __init__(self, path: str, line: int, reason: str):
        self.path = str(path)
        self.line = line
        self.reason = reason
        super().__init__(f"{self.path}, line {line}: {reason}")

    def __reduce__(self):
        return (type(self), (self.path, self.line, self.reason))


class TokenizerMismatchError(ShardtokError):
    """The fast tokenizer backend gave other ids than tokenizers for an input document.

    `record` counts as in BadRecordError: the line for JSONL and text, the row for Parquet.
    """

    def __init__(self, path: str, record: int, reason: str):
        self.path = str(path)
        self.record = record
        self.reason = reason
        super().__init__(f"{self.path}, record {record}: {reason}")

    def __reduce__(self):
        return (type(self), (self.path, self.record, self.reason))


class StorageError(ShardtokError):
    """Reading bytes from a URL failed for good (after retries), or the URL cannot be read at all."""

    def __init__(self, url: str, offset: int | None, reason: str):
        self.url = url
        self.offset = offset
        self.reason = reason
        where = url if offset is None else f"{url} at byte offset {offset}"
        super().__init__(f"{where}: {reason}")

    def __reduce__(self):
        return (type(self), (self.url, self.offset, self.reason))


class UsageError(ShardtokError, ValueError):
    """An option or argument that cannot work (a zero batch size, a rank outside the world, a
    weight that is not a finite positive number...): the caller's mistake, not the data's.

    Also a ValueError, which is what code written before it existed caught. `shardtok` exits
    with status 2 for it (1 for bad data)."""


class ResumeStateError(ShardtokError):
    """A saved stream state does not belong to this dataset/options, or cannot be applied."""
