"""``StreamOptions``: everything that decides the tokens besides the dataset and the placement.

It is JSON-able so resume can fingerprint it, and its fields are the one list of stream
options: the torch dataset, the CLI and mix configs all take their names from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace

from shardtok.errors import UsageError
from shardtok.stream.batch import check_labels_format

PACKINGS = ("concat", "greedy", "bfd")
OVERLONG = ("split", "drop", "truncate")  # what greedy and bfd do with a too long document
# Document nodes answer ``state_at(p)`` for every p >= position - HISTORY; packers never hold a
# document older than that (concat holds at most seq_len + 1 documents, greedy closes old
# sequences), so resume never needs more.
HISTORY = 1 << 16
# What a field left unset means for data without loss masks: what it always meant before the
# value started to depend on the data (states saved then compare as these).
UNMASKED_DEFAULTS = {"packing": "concat", "overlong": "split"}


MAX_TOKEN_ID = 2**31 - 1  # int32, the widest token dtype
# Tokens in one batch: 1 GiB per int64 array at the bound, some hundred times any batch trained
# on today; a config from someone else asking for more would only end in a failed allocation.
MAX_BATCH_TOKENS = 2**27


@dataclass(frozen=True)
class StreamOptions:
    seq_len: int
    batch_size: int
    # None: by the data, "greedy" when a source has loss masks (fine-tuning data: whole
    # conversations per sequence), else "concat"; see resolve()
    packing: str | None = None
    seed: int = 0
    shuffle_buffer: int = 4096  # documents; 0 turns shuffling off
    interleave: int = 4  # shards read round-robin at once by each worker
    stride: int | None = None  # concat: None = seq_len + 1; seq_len = Megatron's overlap
    lookahead: int = 8  # greedy: open sequences
    pad_id: int = 0  # greedy, bfd: padding token (its labels are always -100)
    mask_boundary_labels: bool = False  # -100 on labels whose target starts another document
    # bfd: documents packed at once. New fields go last with a default: fingerprints saved
    # before them lack the key and compare as the default (resume.fingerprint).
    bfd_window: int = 1000
    labels_format: str = "shifted"  # or "hf": aligned with input_ids, for models that shift
    # greedy, bfd: a document longer than seq_len + 1: "split" into sequences, "truncate" to
    # its first seq_len + 1 tokens, or "drop"; None: truncate fine-tuning data (a conversation's
    # tail without its prompt teaches nothing good), split the rest (keeps every token)
    overlong: str | None = None
    # The shuffle buffer also holds fewer than about this many tokens (0: documents only).
    shuffle_tokens: int = 1 << 22

    def __post_init__(self) -> None:
        # Checked here, once, so that a bad value is one clear error where the options are
        # made (the constructor, a mix config, the command line), not a ValueError deep in a
        # DataLoader worker.
        for name, low in (("seq_len", 1), ("batch_size", 1), ("seed", 0), ("shuffle_buffer", 0),
                          ("shuffle_tokens", 0), ("interleave", 1), ("lookahead", 1), ("pad_id", 0),
                          ("bfd_window", 1)):  # fmt: skip
            _check_int(name, getattr(self, name), low)
        if self.seq_len * self.batch_size > MAX_BATCH_TOKENS:
            raise UsageError(
                f"batch_size x seq_len must be at most {MAX_BATCH_TOKENS:,} tokens, got "
                f"{self.batch_size:,} x {self.seq_len:,}"
            )
        if self.pad_id > MAX_TOKEN_ID:
            raise UsageError(
                f"pad_id must be a token id at most {MAX_TOKEN_ID:,} (tokens are stored as int32 at "
                f"the widest), got {self.pad_id:,}"
            )
        if self.bfd_window > HISTORY:
            raise UsageError(
                f"bfd_window must be at most {HISTORY} (a window is re-read on resume from "
                f"its first document, which the stream remembers that far back), got "
                f"{self.bfd_window}"
            )
        if self.packing is not None and self.packing not in PACKINGS:
            raise UsageError(f"packing must be one of {PACKINGS}, got {self.packing!r}")
        if self.overlong is not None and self.overlong not in OVERLONG:
            raise UsageError(f"overlong must be one of {OVERLONG}, got {self.overlong!r}")
        if self.stride is not None:
            _check_int("stride", self.stride, 1)
            if self.stride > self.seq_len + 1:
                raise UsageError(
                    f"stride must lie in [1, seq_len + 1 = {self.seq_len + 1}], got {self.stride}"
                )
        if not isinstance(self.mask_boundary_labels, bool):
            raise UsageError(
                f"mask_boundary_labels must be true or false, got {self.mask_boundary_labels!r}"
            )
        check_labels_format(self.labels_format)

    def to_dict(self) -> dict:
        return asdict(self)

    def resolve(self, masked: Sequence[bool]) -> StreamOptions:
        """These options for sources whose loss-mask flags are `masked`: an unset packing
        becomes "greedy" if any source has masks, else "concat"; an unset overlong becomes
        "truncate" when every source has masks, "split" when none has, and stays unset (each
        source by its own data, ``overlong_for``) for a mix of both."""
        packing = self.packing or ("greedy" if any(masked) else "concat")
        overlong = self.overlong
        if overlong is None and not any(masked):
            overlong = "split"
        elif overlong is None and all(masked):
            overlong = "truncate"
        return replace(self, packing=packing, overlong=overlong)

    def overlong_for(self, masked: bool) -> str:
        """The overlong rule for one source (see ``resolve``)."""
        return self.overlong or ("truncate" if masked else "split")

    @classmethod
    def from_dict(cls, data: dict) -> StreamOptions:
        return cls(**data)


OPTION_NAMES = tuple(f.name for f in fields(StreamOptions))  # in declaration order


def _check_int(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{name} must be an integer, got {value!r}")
    if value < low:
        raise UsageError(f"{name} must be at least {low}, got {value}")
