"""``StreamOptions``: everything that decides the tokens besides the dataset and the placement.

It is JSON-able so resume can fingerprint it, and its fields are the one list of stream
options: the torch dataset, the CLI and mix configs all take their names from here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields


@dataclass(frozen=True)
class StreamOptions:
    seq_len: int
    batch_size: int
    packing: str = "concat"  # or "greedy"
    seed: int = 0
    shuffle_buffer: int = 4096  # documents; 0 turns shuffling off
    interleave: int = 4  # shards read round-robin at once by each worker
    stride: int | None = None  # concat: None = seq_len + 1; seq_len = Megatron's overlap
    lookahead: int = 8  # greedy: open sequences
    pad_id: int = 0  # greedy: padding token (its labels are always -100)
    mask_boundary_labels: bool = False  # -100 on labels whose target starts another document

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> StreamOptions:
        return cls(**data)


OPTION_NAMES = tuple(f.name for f in fields(StreamOptions))  # in declaration order
