"""What every system's writer and loader is given: the same shard size, sequence length, batch, seed."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class WriteOptions:
    shard_bytes: int = 64 << 20  # every format's shards/chunks aim at this many stored bytes
    frame_bytes: int = 1 << 20  # shardtok's zstd frame (uncompressed bytes)
    seq_len: int = 2048  # LitData aligns its chunks to seq_len + 1 tokens, as its docs do

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ReadOptions:
    seq_len: int = 2048
    batch_size: int = 8
    num_workers: int = 0
    seed: int = 1234
    shuffle_buffer: int = 1000  # documents, for the streaming readers that buffer documents

    def to_json(self) -> dict:
        return asdict(self)
