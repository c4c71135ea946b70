"""A bounded shuffle buffer with exact, token-free resume: a jittered sort of document places.

Document ``i`` of the upstream (its position in the slice) has the place ``p_i = i + S_i / T``,
where ``S_i`` is the number of tokens before it in the slice and ``T = token_window / W`` (with
no token bound, ``p_i = i``), and gets the key ``p_i + W * u_i`` with ``u_i`` uniform in [0, 1)
drawn from ``default_rng((*seed, i // KEY_BLOCK))``; documents are emitted in key order. Since
``p_i <= key_i < p_i + W`` and places grow by at least 1 per document, document ``i`` can be
emitted as soon as every document of place up to ``key_i`` has been read, so what is held spans
less than ``W`` in places: fewer than ``W`` documents and fewer than about ``token_window``
tokens. Every document moves fewer than ``W`` places from where it was read. (A classic
random-replacement buffer can hold a document arbitrarily long, so its state depends on the
whole history.)

Why a token bound besides the count: a window of 4,096 documents holds 4 M tokens of 1,000-token
documents but 400 M of 100 k-token ones, and every document held keeps its whole decoded frame
in memory. On a corpus of short docstrings followed by long files, the count alone made a
stream read all 47 M tokens of it to hand out its first 24 M, at 0.6x its speed with the bound.

The output is a pure function of the ordinals and sizes, so a saved position is just the number
of documents emitted, ``k``, plus where to re-read from (and, with a token bound, how many tokens
come before that document):

* after ``k`` emissions, every ordinal below ``k - W`` has been emitted (its key is below
  ``k - 1``, and at most ``k - 1`` ordinals have smaller keys), and no ordinal from ``k + W``
  on has been;
* so restoring re-reads ordinals ``[b, k + W)`` from a checkpoint ``b <= k - W`` (the upstream
  state saved when ordinal ``b`` was read, every ``spacing`` ordinals), sorts their keys, drops
  the ``k - b`` smallest (already emitted) and buffers the rest.

(Both bounds hold with places as with ordinals: the ``k``-th key is at least ``p_{k-1}``, and
places grow by at least 1 per document.) Restoring costs reading at most ``2 W + spacing``
documents; the state is four integers (five with a token bound) and the upstream's own state.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from shardtok.errors import ResumeStateError
from shardtok.stream import state as envelope
from shardtok.stream.nodes.base import DocumentNode
from shardtok.stream.options import HISTORY

KEY_BLOCK = 4096
MIN_CHECKPOINT_SPACING = 1024
MIN_ROUND = 64
# With a token bound, documents are read in runs of at most this many, sized by the largest
# recent document: a round stays near its token budget where long documents follow short ones.
TOKEN_RUN = 64


class ShuffleBuffer(DocumentNode):
    KIND = "shuffle"
    FIELDS = {"position": envelope.INT, "read_from": envelope.INT, "upstream": envelope.STATE}
    # With a token bound: the tokens of the slice before document `read_from`.
    TOKEN_FIELDS = {**FIELDS, "read_tokens": envelope.INT}

    """Shuffles documents within a window of `window` documents (leave the node out to disable
    shuffling).

    Documents are read in rounds of ``max(64, window // 16)``; after each round every buffered
    document whose key is below the next ordinal is released in key order (one numpy sort per
    round instead of a heap operation per document). At most about ``1.06 * window`` documents
    are held. The output does not depend on the round size (released keys are always the
    smallest left); small rounds keep a DataLoader worker's time per batch even, where one
    round of a quarter window (several frames to decode at once) stalled the in-order batch
    queue while the other worker idled (a quarter of both cores, measured).
    """

    def __init__(
        self,
        upstream: DocumentNode,
        window: int,
        seed: Sequence[int],
        token_window: int = 0,
    ):
        """`token_window`: also hold fewer than about that many tokens (0: no token bound)."""
        super().__init__()
        if window < 1:
            raise ValueError(f"shuffle window must be at least 1, got {window}")
        if token_window < 0:
            raise ValueError(f"shuffle token window must be at least 0, got {token_window}")
        self.upstream = upstream
        self.window = int(window)
        self.token_window = int(token_window)
        # Places per token (1 / T above); 0.0 leaves places (and keys) exactly the ordinals.
        self._per_token = self.window / self.token_window if self.token_window else 0.0
        self.seed = tuple(int(s) for s in seed)
        self.spacing = max(self.window, MIN_CHECKPOINT_SPACING)
        self.round = max(MIN_ROUND, self.window // 16)
        self._keys = np.empty(0)  # keys and ordinals of buffered, not yet released documents
        self._ordinals = np.empty(0, dtype=np.int64)
        self._held: dict[int, np.ndarray] = {}
        self._ready: deque[np.ndarray] = deque()
        # ordinal -> (upstream state there, tokens before it)
        self._checkpoints: dict[int, tuple[dict, int]] = {}
        self._key_cache: tuple[int, np.ndarray] = (-1, np.empty(0))
        self._exhausted = False
        self._tokens_read = 0  # tokens of the documents read (before upstream.position)
        self._largest = 0  # tokens of the largest document of the last run read
        self.position = 0

    @property
    def held(self) -> int:
        """Documents in memory (buffered or released but not yet emitted)."""
        return len(self._held) + len(self._ready)

    @property
    def held_tokens(self) -> int:
        """Tokens of the documents in memory (a pass over them: for tests and benchmarks)."""
        return sum(map(len, self._held.values())) + sum(map(len, self._ready))

    # -- keys ---------------------------------------------------------------------------
    def _block_keys(self, block: int) -> np.ndarray:
        if self._key_cache[0] != block:
            rng = np.random.default_rng((*self.seed, block))
            self._key_cache = (block, rng.random(KEY_BLOCK) * self.window)
        return self._key_cache[1]

    def keys(self, lo: int, hi: int, tokens_before: np.ndarray | None = None) -> np.ndarray:
        """Keys of ordinals [lo, hi); `tokens_before`: each one's S_i (needed with a token
        bound)."""
        parts = []
        at = lo
        while at < hi:
            block, offset = divmod(at, KEY_BLOCK)
            take = min(hi - at, KEY_BLOCK - offset)
            parts.append(self._block_keys(block)[offset : offset + take])
            at += take
        jitter = np.concatenate(parts) if parts else np.empty(0)
        return self._places(np.arange(lo, hi, dtype=np.float64), tokens_before) + jitter

    def _places(self, ordinals: np.ndarray, tokens_before) -> np.ndarray:
        if not self._per_token:
            return ordinals
        return ordinals + np.asarray(tokens_before, dtype=np.float64) * self._per_token

    def _next_place(self) -> float:
        """The place of the next document to read: no unread document has a smaller key."""
        at = np.array([float(self.upstream.position)])
        return float(self._places(at, [self._tokens_read])[0])

    # -- reading ------------------------------------------------------------------------
    def _read(self, until: int, tokens: int | None = None) -> None:
        """Read ordinals up to `until` (exclusive) into the buffer; with `tokens`, stop once
        about that many tokens are read (by the largest recent document, at most
        ``TOKEN_RUN`` documents past it)."""
        upstream = self.upstream
        held = self._held
        first = upstream.position
        spacing = self.spacing
        befores: list[np.ndarray] = []
        while upstream.position < until and (tokens is None or tokens > 0):
            ordinal = upstream.position
            if ordinal % spacing == 0 and ordinal not in self._checkpoints:
                self._checkpoints[ordinal] = (upstream.state_at(ordinal), self._tokens_read)
                self._prune(ordinal)
            # In runs that stop at the next checkpoint ordinal, so each is saved when reached.
            count = min(until, (ordinal // spacing + 1) * spacing) - ordinal
            if tokens is not None:
                count = min(count, TOKEN_RUN, max(1, tokens // max(1, self._largest)))
            docs = upstream._next_many(count)
            held.update(zip(range(ordinal, ordinal + len(docs)), docs))
            if self._per_token and docs:
                sizes = np.fromiter(map(len, docs), np.int64, len(docs))
                ends = np.cumsum(sizes)
                befores.append(self._tokens_read + ends - sizes)
                self._tokens_read += int(ends[-1])
                self._largest = int(sizes.max())
                if tokens is not None:
                    tokens -= int(ends[-1])
            if len(docs) < count:
                self._exhausted = True
                break
        last = upstream.position
        if last > first:
            tokens_before = np.concatenate(befores) if befores else None
            self._keys = np.concatenate((self._keys, self.keys(first, last, tokens_before)))
            self._ordinals = np.concatenate((self._ordinals, np.arange(first, last)))

    def _release(self, below: float | None) -> None:
        """Move buffered documents with key < `below` (all when None) to the ready queue."""
        keys, ordinals = self._keys, self._ordinals
        if below is None:
            chosen = np.arange(len(keys))
        else:
            chosen = np.flatnonzero(keys < below)
        if not len(chosen):
            return
        order = chosen[np.lexsort((ordinals[chosen], keys[chosen]))]
        held = self._held
        self._ready.extend(map(held.pop, ordinals[order].tolist()))
        keep = np.ones(len(keys), dtype=bool)
        keep[chosen] = False
        self._keys, self._ordinals = keys[keep], ordinals[keep]

    def _prune(self, ordinal: int) -> None:
        horizon = ordinal - HISTORY - 2 * self.window - 2 * self.spacing
        for old in [c for c in self._checkpoints if c < horizon]:
            del self._checkpoints[old]

    def _refill(self) -> bool:
        """Make documents ready to emit; False at the end of the stream."""
        while not self._ready:
            if self._exhausted:
                if not self._held:
                    return False
                self._release(None)
                continue
            budget = max(1, self.token_window // 16) if self._per_token else None
            self._read(self.upstream.position + self.round, budget)
            self._release(None if self._exhausted else self._next_place())
        return True

    def _next(self) -> np.ndarray:
        if not self._ready and not self._refill():
            raise StopIteration
        self.position += 1
        return self._ready.popleft()

    def _next_many(self, count: int) -> list[np.ndarray]:
        out: list[np.ndarray] = []
        ready = self._ready
        while len(out) < count and (ready or self._refill()):
            if len(ready) <= count - len(out):  # all of them: one step, not one per document
                out += ready
                ready.clear()
            else:
                popleft = ready.popleft
                out += [popleft() for _ in range(count - len(out))]
        self.position += len(out)
        return out

    # -- state --------------------------------------------------------------------------
    def _checkpoint_for(self, position: int) -> int:
        return max(0, (position - self.window) // self.spacing * self.spacing)

    def state_at(self, position: int) -> dict:
        if not self._started:
            self.reset(None)
        if position > self.position:
            raise ValueError(f"position {position} is ahead of the stream ({self.position})")
        base = self._checkpoint_for(position)
        if base not in self._checkpoints:
            raise ValueError(
                f"shuffle buffer cannot describe position {position}: it is more than "
                f"{HISTORY} documents back or before the point this stream was restored to"
            )
        upstream, tokens = self._checkpoints[base]
        if not self.token_window:  # the fields a state had before the token bound
            return self._wrap(position=position, read_from=base, upstream=upstream)
        return self._wrap(position=position, read_from=base, upstream=upstream, read_tokens=tokens)

    @classmethod
    def parse_state(cls, state: object) -> dict:
        with_tokens = isinstance(state, dict) and "read_tokens" in state
        return envelope.parse(state, cls.KIND, cls.TOKEN_FIELDS if with_tokens else cls.FIELDS)

    def _reset(self, state: dict | None) -> None:
        self._keys = np.empty(0)
        self._ordinals = np.empty(0, dtype=np.int64)
        self._held = {}
        self._ready = deque()
        self._checkpoints = {}
        self._exhausted = False
        self._tokens_read = 0
        if state is None:
            self.upstream.reset(None)
            self.position = start = self.upstream.position  # ordinals are upstream positions
            self._checkpoints[start] = (self.upstream.state_at(start), 0)
            return
        state = self.parse_state(state)
        if ("read_tokens" in state) != bool(self.token_window):
            saved = "with" if "read_tokens" in state else "without"
            raise ResumeStateError(
                f"shuffle state: saved {saved} a token bound on the shuffle buffer, this stream "
                f"has {'one' if self.token_window else 'none'} (shuffle_tokens "
                f"{self.token_window}); resume with the shuffle options it was saved with"
            )
        position, base = state["position"], state["read_from"]
        envelope.check_range(self.KIND, "read_from", base, 0, position)
        # A state re-reads from the checkpoint before `position - window` (module docstring):
        # a position further on would hold everything up to it in the buffer.
        envelope.check_range(self.KIND, "position", position, 0, base + self.window + self.spacing)
        self.upstream.reset(state["upstream"])
        if self.upstream.position != base:
            raise ResumeStateError(
                f"upstream restored to {self.upstream.position}, shuffle state expects {base}"
            )
        self._tokens_read = state.get("read_tokens", 0)
        self._checkpoints[base] = (state["upstream"], self._tokens_read)
        # Ordinals [base, position + window) hold everything not yet emitted that could come
        # next; the (position - base) smallest keys among them were emitted already.
        self._read(position + self.window)
        self.position = position
        skip = position - base
        if skip:
            order = np.lexsort((self._ordinals, self._keys))[:skip]
            for o in self._ordinals[order].tolist():
                del self._held[o]
            keep = np.ones(len(self._keys), dtype=bool)
            keep[order] = False
            self._keys, self._ordinals = self._keys[keep], self._ordinals[keep]
