"""The progress bars of a conversion and its final summary.

The bar's total is input bytes (known before any work starts), so its ETA is meaningful from the
first finished unit; documents, tokens and tokens/s ride along as the postfix.

Progress is asked for with ``progress``: ``"auto"`` (or True) shows a tqdm bar when stderr is a
terminal and nothing otherwise; ``"always"`` shows the bar on a terminal and, elsewhere (a log
file, CI), a plain line every ``LINE_INTERVAL`` seconds and one at the end, since tqdm's
carriage-return frames make a log unreadable; ``"never"`` (or False) shows nothing. Notes for
the user are log records (``logging.getLogger(__name__)``), not prints: the command line shows
them above the bar.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field

from shardtok.format.manifest import Manifest

logger = logging.getLogger(__name__)

PROGRESS_MODES = ("auto", "always", "never")
LINE_INTERVAL = 10.0  # seconds between the plain progress lines of "always" off a terminal


def progress_mode(progress: bool | str) -> str:
    """The mode a ``progress`` argument asks for: "auto" (True), "always" or "never" (False)."""
    if progress is True or progress is False:
        return "auto" if progress else "never"
    if progress not in PROGRESS_MODES:
        raise ValueError(
            f"progress must be True, False or one of {PROGRESS_MODES}, got {progress!r}"
        )
    return progress


def progress_bar(progress: bool | str, total: int, desc: str, **tqdm_options):
    """A tqdm bar on a terminal, ``LineProgress`` off one with "always", else None."""
    mode = progress_mode(progress)
    if mode == "never":
        return None
    if sys.stderr.isatty():
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, file=sys.stderr, dynamic_ncols=True, **tqdm_options)
    if mode == "always":
        return LineProgress(total, desc, unit=tqdm_options.get("unit", "item"))
    return None


class LineProgress:
    """The part of tqdm's interface the conversion uses, as a plain line on stderr at most every
    ``LINE_INTERVAL`` seconds and one when closed: progress that reads well in a log file."""

    def __init__(self, total: int, desc: str, *, unit: str = "item"):
        self.total, self.desc, self.unit = total, desc, unit
        self.n = 0
        self.postfix = ""
        self._start = self._last = time.monotonic()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self._last >= LINE_INTERVAL:
            self._last = now
            self._line(now)

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        self.postfix = text

    def close(self) -> None:
        self._line(time.monotonic())

    def _line(self, now: float) -> None:
        share = f"{100 * self.n / self.total:.0f}%" if self.total else "100%"
        if self.unit == "B":
            done = f"{size_text(self.n)} of {size_text(self.total)}"
        else:
            done = f"{self.n:,} of {self.total:,} {self.unit}{plural(self.total)}"
        more = f" {self.postfix}" if self.postfix else ""
        elapsed = f"{now - self._start:.0f} s"
        print(f"{self.desc}: {share} ({done}){more}, {elapsed}", file=sys.stderr, flush=True)


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
    """The bar of the tokenizing phase (see the module docstring for `progress`)."""

    def __init__(self, total_bytes: int, progress: bool | str):
        self.documents = 0
        self.tokens = 0
        self._tokenized = 0  # tokens this run produced itself, for a truthful tokens/s
        self._start = time.monotonic()
        self._bar = progress_bar(
            progress, total_bytes, "converting", unit="B", unit_scale=True, unit_divisor=1024
        )

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
        """Something the user should know (a unit redone, a pattern rewritten): a warning
        record, which the command line prints above the bar."""
        logger.warning("%s", text)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if logger.isEnabledFor(logging.INFO):
            seconds = time.monotonic() - self._start
            logger.info(
                "tokenized %s documents, %s tokens in %.1f s (%s tokens this run)",
                f"{self.documents:,}", f"{self.tokens:,}", seconds, f"{self._tokenized:,}",
            )  # fmt: skip


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
