"""Frames decoded ahead in a helper thread (``shardtok.format.decode_ahead``): the same documents,
batches, states and errors as decoding in place, and no thread left behind (end of the slice,
an abandoned iterator, an error, a dropped owner, a fork)."""

from __future__ import annotations

import gc
import io
import json
import multiprocessing
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardtok.errors import CorruptShardError
from shardtok.format import ShardStreamReader, load_manifest
from shardtok.format.decode_ahead import DecodeAhead
from shardtok.stream.masked import flag_frame, flag_untrained
from shardtok.stream.nodes.base import take
from shardtok.stream.nodes.reader import SliceReader
from shardtok.stream.options import StreamOptions
from shardtok.stream.slice_stream import SliceStream
from tests.helpers.masked import Known
from tests.helpers.numpy_batches import copies, same_batches

NAME = "shardtok-decode-ahead"


def ahead_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == NAME and t.is_alive()]


def settle_threads(timeout: float = 5.0) -> list[threading.Thread]:
    """The helper threads still alive once the ending ones had `timeout` s to end."""
    for t in ahead_threads():
        t.join(timeout)
    return ahead_threads()


def slice_reader(stream: SliceStream) -> SliceReader:
    node = stream.batcher.upstream
    while not isinstance(node, SliceReader):
        node = node.upstream
    return node


def in_place(stream: SliceStream) -> SliceStream:
    """`stream` with its reader decoding every frame itself (the reference path)."""
    slice_reader(stream)._ahead = None
    return stream


# -- the helper itself ------------------------------------------------------------------------


def occupy(ahead: DecodeAhead, gate: threading.Event):
    """A task the helper is running (returned once it has started), blocked until `gate`."""
    started = threading.Event()

    def block() -> bool:
        started.set()
        return gate.wait(30)

    busy = ahead.submit(block)
    assert started.wait(30)
    return busy


def test_results_in_order_and_errors_raised_where_asked():
    ahead = DecodeAhead()
    pending = [ahead.submit(pow, 2, n) for n in range(20)]
    failing = ahead.submit(int, "not a number")
    after = ahead.submit(len, "abc")
    assert [p.result() for p in pending] == [2**n for n in range(20)]
    with pytest.raises(ValueError, match="not a number"):
        failing.result()
    assert after.result() == 3  # an error ends nothing
    ahead.close()
    assert not settle_threads()


def test_a_caller_waiting_runs_queued_tasks_itself():
    ahead = DecodeAhead()
    gate = threading.Event()
    busy = occupy(ahead, gate)
    ran: list[tuple[str, threading.Thread]] = []

    def record(name: str, then_open: bool = False) -> str:
        ran.append((name, threading.current_thread()))
        if then_open:
            gate.set()
        return name

    queued = [ahead.submit(record, "b"), ahead.submit(record, "c", True)]
    # Waiting for the helper's task, the caller runs what is queued behind it, in order; the
    # last of them opens the gate, so nothing here waits on anything but those tasks.
    assert busy.result() is True
    assert [p.result() for p in queued] == ["b", "c"]
    assert ran == [("b", threading.main_thread()), ("c", threading.main_thread())]
    ahead.close()
    assert not settle_threads()


def test_an_interrupt_in_a_task_the_caller_runs_reaches_it_at_once():
    ahead = DecodeAhead()
    gate = threading.Event()
    busy = occupy(ahead, gate)

    def interrupted() -> None:
        gate.set()
        raise KeyboardInterrupt

    stolen = ahead.submit(interrupted)
    with pytest.raises(KeyboardInterrupt):
        busy.result()  # not held in `stolen` until someone asks for it
    stolen.wait()  # and done, so a stream closing after the interrupt does not hang on it
    ahead.close()
    assert not settle_threads()


def test_a_waiting_caller_leaves_the_helpers_stop_to_it():
    from queue import SimpleQueue

    from shardtok.format.decode_ahead import Pending

    class NotYet(threading.Event):
        """Not done when the caller first looks, done once it waits (the helper's doing)."""

        def wait(self, timeout=None) -> bool:
            self.set()
            return True

    tasks: SimpleQueue = SimpleQueue()
    tasks.put(None)
    pending = Pending(tasks)
    pending._done = NotYet()
    pending._value = "value"
    assert pending.result() == "value"
    assert tasks.get_nowait() is None  # still queued, for the helper to end on
    assert tasks.empty()


def test_the_thread_ends_with_its_owner():
    ahead = DecodeAhead()
    ahead.submit(len, "x").result()
    (thread,) = ahead_threads()
    del ahead
    gc.collect()
    thread.join(5)
    assert not thread.is_alive()


def _use_inherited(ahead: DecodeAhead, out) -> None:
    out.put(ahead.submit(sum, [1, 2, 3]).result())


def test_a_forked_child_starts_its_own_thread():
    ahead = DecodeAhead()
    assert ahead.submit(len, "ab").result() == 2  # the parent's thread runs
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    child = context.Process(target=_use_inherited, args=(ahead, out))
    child.start()
    assert out.get(timeout=30) == 6
    child.join(30)
    assert child.exitcode == 0
    assert ahead.submit(len, "abc").result() == 3  # the parent's is untouched
    ahead.close()


# -- documents and errors ---------------------------------------------------------------------


def write(tmp: Path, lengths: list[int], masked: bool, frame_size: int = 256) -> tuple[Known, Path]:
    known = Known(lengths)
    path = known.write(tmp / ("masked" if masked else "plain"), masked=masked,
                       frame_size=frame_size, shard_size=1 << 20)  # fmt: skip
    return known, path


def read(path: Path, start: int, stop: int | None, ahead, masked: bool, combine: bool):
    manifest = load_manifest(path)
    shard = path / manifest.shards[0].file
    from shardtok.format.shard_reader import PathSource

    with open(shard, "rb") as f:
        reader = ShardStreamReader(f, str(shard), mask_source=PathSource(shard) if masked else None)
        docs = reader.documents(
            start, stop, with_masks=masked, combine=flag_untrained if combine else None,
            **({"ahead": ahead} if ahead is not None else {}),
        )  # fmt: skip
        return [np.copy(d) if not isinstance(d, tuple) else tuple(map(np.copy, d)) for d in docs]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(1, 300), min_size=1, max_size=60),
    masked=st.booleans(),
    combine=st.booleans(),
    cut=st.tuples(st.integers(0, 60), st.integers(0, 60)),
)
def test_reader_documents_are_the_same_ahead(lengths, masked, combine, cut):
    start, stop = sorted(cut)
    start, stop = min(start, len(lengths)), min(stop, len(lengths)) or None
    with tempfile.TemporaryDirectory() as tmp:
        _, path = write(Path(tmp), lengths, masked)
        ahead = DecodeAhead()
        want = read(path, start, stop, None, masked, masked and combine)
        got = read(path, start, stop, ahead, masked, masked and combine)
        ahead.close()
    assert len(got) == len(want)
    for g, w in zip(got, want):
        for a, b in zip(g if isinstance(g, tuple) else [g], w if isinstance(w, tuple) else [w]):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("masked", [False, True])
def test_documents_decoded_by_the_waiting_caller_are_the_same(tmp_path, masked):
    """The helper stays busy, so the reader's caller decodes (and flags) every frame itself
    while it waits: documents equal to decoding in place."""
    known, path = write(tmp_path, [(n * 37) % 300 + 1 for n in range(80)], masked)
    want = read(path, 3, 77, None, masked, masked)
    ahead = DecodeAhead()
    gate = threading.Event()
    busy = occupy(ahead, gate)
    got = read(path, 3, 77, ahead, masked, masked)
    gate.set()
    assert busy.result() is True
    ahead.close()
    assert len(got) == len(want) == 74
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_frames_decoded_in_two_threads_at_once_are_right(tmp_path):
    """Decode contexts and the mask frame cache under two threads decoding one reader's frames
    (what a helping caller and the helper do, and threads other than the stream's own):
    every frame equal to a sequential decode."""
    from concurrent.futures import ThreadPoolExecutor

    from shardtok.format.shard_reader import PathSource

    _, path = write(tmp_path, [(n * 53) % 200 + 1 for n in range(300)], True, frame_size=512)
    shard = path / load_manifest(path).shards[0].file
    with open(shard, "rb") as f:
        reader = ShardStreamReader(f, str(shard), mask_source=PathSource(shard))
        masks = reader._open_masks()
        frames = list(range(len(reader.meta.frames)))
        stored = [reader._read_frame(n, n == 0) for n in frames]

        def decode(n: int) -> np.ndarray:
            # flagged in place, in the frame's own buffer, as the stream reader does
            bits = reader._mask_bits(masks, n)
            return np.copy(reader._decode_frame(n, stored[n], bits, flag_frame)[1])

        want = [decode(n) for n in frames]
        assert len(frames) > 20
        with ThreadPoolExecutor(2) as pool:
            for _ in range(5):
                order = frames[::-1] + frames  # neighbours decoded at once, cache shared
                got = list(pool.map(decode, order))
                for n, array in zip(order, got):
                    np.testing.assert_array_equal(array, want[n])


def test_a_corrupt_frame_fails_at_the_same_document(tmp_path):
    _, path = write(tmp_path, [37] * 200, masked=False, frame_size=400)
    manifest = load_manifest(path)
    shard = path / manifest.shards[0].file
    reader = ShardStreamReader(io.BytesIO(shard.read_bytes()), "probe")
    frame = reader.meta.frames[5]
    data = bytearray(shard.read_bytes())
    data[
        reader.head.bin_header.data_offset + frame.compressed_offset + frame.compressed_size // 2
    ] ^= 0xFF

    def until_error(ahead):
        reader = ShardStreamReader(io.BytesIO(bytes(data)), "damaged.tar")
        seen = 0
        with pytest.raises(CorruptShardError) as error:
            for _ in reader.documents(**({"ahead": ahead} if ahead else {})):
                seen += 1
        return seen, str(error.value)

    ahead = DecodeAhead()
    assert until_error(ahead) == until_error(None)
    assert until_error(None)[0] == frame.first_document  # every earlier frame's documents
    ahead.close()


@pytest.mark.parametrize("damaged", [("mask",), ("mask", "tokens")])
def test_a_corrupt_mask_frame_fails_at_the_same_document(tmp_path, damaged):
    """Mask frames are read and decoded by the thread that submits them, ahead of the token
    frames they go with; their errors still surface at their own frame's first document, and
    a frame whose tokens are damaged too reports its tokens, as read in place."""
    from shardtok.format.shard_reader import PathSource

    _, path = write(tmp_path, [37] * 200, masked=True, frame_size=400)
    clean = path / load_manifest(path).shards[0].file
    data = bytearray(clean.read_bytes())
    reader = ShardStreamReader(io.BytesIO(bytes(data)), "probe", mask_source=PathSource(clean))
    masks = reader._open_masks()
    frame = reader.meta.frames[5]
    mask_frame = masks.frames[5]
    data[masks.header.data_offset + mask_frame.compressed_offset + 2] ^= 0xFF
    if "tokens" in damaged:
        data[
            reader.head.bin_header.data_offset
            + frame.compressed_offset
            + frame.compressed_size // 2
        ] ^= 0xFF
    damaged_file = tmp_path / "damaged.tar"
    damaged_file.write_bytes(bytes(data))

    def until_error(ahead):
        with open(damaged_file, "rb") as f:
            reader = ShardStreamReader(f, "damaged.tar", mask_source=PathSource(damaged_file))
            seen = 0
            with pytest.raises(CorruptShardError) as error:
                for _ in reader.documents(
                    with_masks=True, combine=flag_frame, **({"ahead": ahead} if ahead else {})
                ):
                    seen += 1
        return seen, str(error.value)

    ahead = DecodeAhead()
    got = until_error(ahead)
    assert got == until_error(None)
    assert got[0] == frame.first_document  # every earlier frame's documents
    member = reader.head.bin_header.name if "tokens" in damaged else masks.header.name
    assert member in got[1] and "frame 5" in got[1]
    ahead.close()


# -- whole streams ----------------------------------------------------------------------------


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(1, 200), min_size=20, max_size=80),
    masked=st.booleans(),
    packing=st.sampled_from(["concat", "greedy", "bfd"]),
    labels_format=st.sampled_from(["shifted", "hf"]),
    shuffle_buffer=st.sampled_from([0, 9]),
    workers=st.sampled_from([1, 2]),
)
def test_streams_are_the_same_ahead(
    lengths, masked, packing, labels_format, shuffle_buffer, workers
):
    options = StreamOptions(seq_len=15, batch_size=2, packing=packing, seed=3, interleave=2,
                            labels_format=labels_format, shuffle_buffer=shuffle_buffer,
                            bfd_window=5)  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        known = Known(lengths)
        path = known.write(Path(tmp) / "d", masked=masked, frame_size=128, shard_size=900)
        for worker in range(workers):
            placement = dict(worker=worker, num_workers=workers)
            try:
                fast = SliceStream(path, options, **placement)
            except Exception as exc:  # too little data for this layout: both refuse alike
                with pytest.raises(type(exc)):
                    SliceStream(path, options, **placement)
                continue
            slow = in_place(SliceStream(path, options, **placement))
            same_batches(copies(fast), copies(slow))
            assert fast.state_dict() == slow.state_dict()
            # and resumed halfway, from a state either path wrote
            half = len(fast) // 2
            again = SliceStream(path, options, **placement)
            take(again, half)
            state = json.loads(json.dumps(again.state_dict()))
            resumed = SliceStream(path, options, **placement)
            resumed.reset(state)
            reference = in_place(SliceStream(path, options, **placement))
            reference.reset(state)
            same_batches(copies(resumed), copies(reference))
            again.close()  # left halfway: its thread ends here (else when it is collected)
            assert not settle_threads()


@pytest.fixture
def dataset(tmp_path) -> Path:
    return Known([int(n) for n in np.random.default_rng(0).integers(1, 200, 250)]).write(
        tmp_path / "d", masked=False, frame_size=512, shard_size=6000
    )


OPTIONS = StreamOptions(seq_len=31, batch_size=2, seed=1, shuffle_buffer=16)


def test_no_thread_after_the_slice_is_read(dataset):
    stream = SliceStream(dataset, OPTIONS)
    batches = list(stream)
    assert batches
    assert not settle_threads()  # ended with the slice, without a collection


def test_no_thread_after_an_abandoned_iterator(dataset):
    torch = pytest.importorskip("torch")
    del torch
    from shardtok.torch import ShardLoader, ShardStreamDataset

    loader = ShardLoader(ShardStreamDataset(dataset, options=OPTIONS), num_workers=0)
    it = iter(loader)
    next(it)
    next(it)
    assert ahead_threads()
    del it  # the loader and its dataset (which keeps the stream's state) stay
    assert not settle_threads()
    assert loader.state_dict()["workers"][0]["stream"] is not None


def test_no_thread_after_an_error(dataset):
    manifest = load_manifest(dataset)
    shard = dataset / manifest.shards[1].file
    reader = ShardStreamReader(io.BytesIO(shard.read_bytes()), "probe")
    frame = reader.meta.frames[-1]
    data = bytearray(shard.read_bytes())
    data[reader.head.bin_header.data_offset + frame.compressed_offset + 10] ^= 0xFF
    shard.write_bytes(bytes(data))
    stream = SliceStream(dataset, OPTIONS)
    with pytest.raises(CorruptShardError, match=manifest.shards[1].file):
        list(stream)
    del stream
    gc.collect()
    assert not settle_threads()


def _forked_batches(dataset: str, out) -> None:
    out.put(copies(SliceStream(dataset, OPTIONS)))


def test_a_stream_started_before_a_fork_streams_in_the_child(dataset):
    stream = SliceStream(dataset, OPTIONS)
    first = copies(take(stream, 2))
    assert ahead_threads()
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    child = context.Process(target=_forked_batches, args=(str(dataset), out))
    child.start()
    from_child = out.get(timeout=60)
    child.join(60)
    assert child.exitcode == 0
    same_batches(from_child, first + copies(stream))


def test_no_thread_after_an_abandoned_iterator_over_a_mix(tmp_path):
    torch = pytest.importorskip("torch")
    del torch
    from shardtok.torch import ShardLoader, ShardStreamDataset
    from tests.helpers.stages import write_sources

    paths = write_sources(tmp_path)
    mix = {paths[0]: 0.5, paths[1]: 0.5}
    dataset = ShardStreamDataset(mix, options=OPTIONS, num_batches=20)
    it = iter(ShardLoader(dataset, num_workers=0))
    next(it)
    next(it)
    assert len(ahead_threads()) >= 2  # one per source's slice reader
    del it  # closing the stream reaches every source's reader, not only a single upstream
    assert not settle_threads()
