"""The progress bar of a conversion and its final summary.

The bar's total is input bytes (known before any work starts), so its ETA is meaningful from the
first finished unit; documents, tokens and tokens/s ride along as the postfix.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

from shardtok.format.manifest import Manifest


def size_text(n: int) -> str:
    """A byte count for people: "512 B", "16.0 MiB"."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:,} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError


def plural(n: int) -> str:
    """The "s" of a count's noun: f"unit{plural(n)}"."""
    return "" if n == 1 else "s"


class ConvertProgress:
    def __init__(self, total_bytes: int, enabled: bool):
        self.documents = 0
        self.tokens = 0
        self._tokenized = 0  # tokens this run produced itself, for a truthful tokens/s
        self._start = time.monotonic()
        self._bar = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(
                total=total_bytes, unit="B", unit_scale=True, unit_divisor=1024,
                desc="converting", file=sys.stderr, dynamic_ncols=True,
            )  # fmt: skip

    def unit_done(self, input_bytes: int, documents: int, tokens: int, reused: bool) -> None:
        self.documents += documents
        self.tokens += tokens
        if not reused:
            self._tokenized += tokens
        if self._bar is not None:
            rate = self._tokenized / max(time.monotonic() - self._start, 1e-9)
            self._bar.set_postfix_str(
                f"docs={self.documents:,} tokens={self.tokens:,} tok/s={rate:,.0f}", refresh=False
            )
            self._bar.update(input_bytes)

    def note(self, text: str) -> None:
        """A line for the user on stderr, above the bar rather than through it."""
        if self._bar is not None:
            self._bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


@dataclass
class ConvertResult:
    """What a conversion did; `summary()` is what the CLI prints."""

    output: str
    manifest: Manifest
    records_read: int
    documents: int
    rejected: dict[str, int] = field(default_factory=dict)
    units_total: int = 0
    units_reused: int = 0
    units_tokenized: int = 0
    seconds: float = 0.0
    already_complete: bool = False
    rejects_path: str | None = None
    stored_token_bytes: int = 0  # the shards' bin members (frames), for the compression ratio
    tokenizer_backend: str = ""  # "hf" or "tiktoken"; empty when nothing was tokenized
    tokenizer_backend_note: str = ""
    # SFT conversions: trained_tokens, boundary_tokens, truncated_records (the manifest's
    # extra["sft_stats"]); None for plain text
    sft: dict | None = None

    @property
    def records_rejected(self) -> int:
        return sum(self.rejected.values())

    @property
    def compression_ratio(self) -> float:
        """Raw token bytes over stored (zstd) token bytes, as `shardtok inspect` reports it."""
        token_bytes = self.manifest.num_tokens * self.manifest.dtype.itemsize
        return token_bytes / self.stored_token_bytes if self.stored_token_bytes else 1.0

    def summary(self) -> str:
        m = self.manifest
        if self.already_complete:
            head = f"{self.output} already holds this conversion; nothing to do."
        else:
            rate = m.num_tokens / self.seconds if self.seconds > 0 else 0.0
            head = f"converted in {self.seconds:.1f} s ({rate:,.0f} tokens/s) into {self.output}"
        lines = [
            head,
            f"  documents   {m.num_documents:,}   tokens {m.num_tokens:,}   dtype {m.dtype.name}",
            f"  shards      {len(m.shards):,}   bytes {m.num_bytes:,}   compression ratio "
            f"{self.compression_ratio:.2f}x (raw {m.dtype.name} tokens / zstd frames)",
            f"  records     {self.records_read:,} read = {self.documents:,} written + "
            f"{self.records_rejected:,} rejected",
        ]
        if self.sft is not None:
            trained = self.sft["trained_tokens"]
            share = trained / m.num_tokens if m.num_tokens else 0.0
            lines.append(
                f"  trained     {trained:,} of {m.num_tokens:,} tokens ({share:.1%})   "
                f"boundary tokens {self.sft['boundary_tokens']:,}   "
                f"truncated records {self.sft['truncated_records']:,}"
            )
        if self.rejected:
            by_reason = ", ".join(f"{k} {v:,}" for k, v in sorted(self.rejected.items()))
            lines.append(f"  rejected    {by_reason}  (details: {self.rejects_path})")
        if not self.already_complete:
            lines.append(
                f"  work units  {self.units_total:,}: {self.units_reused:,} reused from an "
                f"interrupted run, {self.units_tokenized:,} tokenized"
            )
            if self.tokenizer_backend:
                lines.append(
                    f"  backend     {self.tokenizer_backend} ({self.tokenizer_backend_note})"
                )
        return "\n".join(lines)
