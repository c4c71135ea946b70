"""FramePool lends a buffer again only once nothing views it; decoding into it changes nothing.

Reusing memory that a document still views would silently change that document's tokens, so
these tests stamp every lent buffer and check the stamps of everything still held after each
later take.
"""

from __future__ import annotations

import threading
import zlib

import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from shardtok.errors import CorruptShardError
from shardtok.format.frame_pool import STEP, FramePool
from shardtok.format.frames import FrameDecoder
from shardtok.format.shard_meta import Frame
from shardtok.stream.masked import flag_untrained


def test_a_viewed_buffer_is_not_lent_and_a_free_one_is():
    pool = FramePool(spare=0)
    a = pool.take(1000)
    doc = a[10:20].view(np.int16)[1:3]  # a view of a view: it still holds the buffer
    del a
    b = pool.take(1000)
    assert not np.shares_memory(doc, b) and pool.allocated == 2
    del doc
    c = pool.take(500)  # the first buffer is free again
    assert pool.allocated == 2 and len(c) == 500
    assert np.shares_memory(c, pool._buffers[0])


def test_a_tensor_or_memoryview_of_a_document_keeps_its_frame():
    torch = pytest.importorskip("torch")
    pool = FramePool(spare=0)
    frame = pool.take(64)
    frame[:] = 7
    tensor = torch.from_numpy(frame[8:16].view(np.int32))
    window = memoryview(frame[16:24])
    del frame
    other = pool.take(64)
    other[:] = 1
    assert tensor.tolist() == [0x07070707, 0x07070707] and bytes(window) == b"\7" * 8


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.integers(1, 3 * STEP), st.integers(0, 3), st.booleans()),
        min_size=1,
        max_size=60,
    ),
    spare=st.integers(0, 3),
)
def test_nothing_held_is_ever_overwritten(steps, spare):
    pool = FramePool(spare=spare)
    held: list[tuple[np.ndarray, int]] = []
    for stamp, (nbytes, keep, whole) in enumerate(steps):
        frame = pool.take(nbytes)
        assert frame.dtype == np.uint8 and len(frame) == nbytes and frame.flags.writeable
        frame[:] = stamp % 251
        view = frame if whole else frame[nbytes // 3 : nbytes // 3 + 1]
        held.append((view, stamp % 251))
        del frame, view
        held = held[len(held) - keep :] if keep else []  # the oldest documents go
        for view, value in held:
            assert (view == value).all()
        in_use = sum(1 for i in range(len(pool._buffers)) if not _idle(pool, i))
        assert len(pool) <= pool._peak + spare + 1 and in_use <= len(held) + 1


def _idle(pool: FramePool, i: int) -> bool:
    from shardtok.format.frame_pool import _references

    return _references(pool._buffers, i) == pool._unused


def test_two_threads_never_get_the_same_memory():
    pool = FramePool()
    got: list[list[np.ndarray]] = [[], []]

    def work(out):
        for _ in range(300):
            out.append(pool.take(4096))
            if len(out) > 5:
                out.pop(0)
            live = [a for lst in got for a in list(lst)]
            for i, a in enumerate(live):
                for b in live[i + 1 :]:
                    assert a is b or not np.shares_memory(a, b)

    threads = [threading.Thread(target=work, args=(got[k],)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _frame(raw: bytes, stored: bytes, size: int | None = None) -> Frame:
    size = len(raw) if size is None else size
    return Frame(0, len(stored), 0, 0, size, zlib.crc32(raw))


@pytest.mark.parametrize("size", [0, 1, 4096, 3 * STEP + 5])
def test_decoding_into_the_pool_equals_decoding(size):
    raw = np.random.default_rng(size).integers(0, 50, size, dtype=np.uint8).tobytes()
    stored = zstandard.ZstdCompressor(level=3, write_checksum=True).compress(raw)
    decoder = FrameDecoder(True, "s.tar", "s.bin", 512)
    pool = FramePool()
    assert bytes(decoder.decode(_frame(raw, stored), stored, 0, pool)) == raw
    assert decoder.decode(_frame(raw, stored), stored, 0) == raw


@pytest.mark.parametrize("damage", ["checksum", "short", "long", "garbage"])
@pytest.mark.parametrize("declared", [True, False])
def test_a_damaged_frame_fails_the_same_way_into_the_pool(damage, declared):
    raw = np.arange(20000, dtype=np.uint16).tobytes()
    cctx = zstandard.ZstdCompressor(level=3, write_checksum=True, write_content_size=declared)
    stored = cctx.compress(raw)
    frame = _frame(raw, stored)
    if damage == "checksum":
        stored = stored[:-1] + bytes([stored[-1] ^ 0xFF])
    elif damage == "short":
        frame = _frame(raw, stored, len(raw) + 10)
    elif damage == "long":
        frame = _frame(raw, stored, len(raw) - 10)
    else:
        stored = stored[:12] + b"\x55" * (len(stored) - 12)
    decoder = FrameDecoder(True, "s.tar", "s.bin", 512)
    errors = []
    for pool in (None, FramePool()):
        with pytest.raises(CorruptShardError) as caught:
            decoder.decode(frame, stored, 3, pool)
        errors.append(str(caught.value))
    assert all("s.tar" in e and "frame 3" in e for e in errors)
    if damage in ("short", "long") and declared:  # refused from the header, before decoding
        assert errors[0] == errors[1]


def test_flags_into_a_given_array_equal_a_new_one():
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 2**31 - 1, 1000).astype(np.int32)
    mask = rng.integers(0, 2, 1000).astype(np.uint8)
    out = np.full(1000, 12345, dtype=np.int32)
    assert flag_untrained(tokens, mask, out=out) is out
    assert np.array_equal(out, flag_untrained(tokens, mask))
