"""Address sources: every stage decides from lengths and positions alone, so a stream over token
addresses packs the same tokens into the same slots as the real stream, for every packer and
overlong rule, the shuffle buffer, masked data, a mix and an elastic remainder."""

from __future__ import annotations

import numpy as np
import pytest

from shardtok.dataset.source import DatasetSource
from shardtok.stream import StreamOptions, StreamSetup, merge_states, mix_spec
from shardtok.stream.masked import split_flags
from shardtok.stream.provenance import AddressSource, split_addresses
from shardtok.stream.provenance.skip import skip_rows
from shardtok.stream.resume.saved import MergedState, Placement, WorkerState, parse_saved
from tests.helpers.masked import Known


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("addresses")
    rng = np.random.default_rng(11)
    plain = Known([int(n) for n in rng.integers(1, 80, size=120)], first=1)
    lengths = [int(n) for n in rng.integers(1, 60, size=120)]
    lengths[7] = lengths[50] = 150  # longer than a sequence: overlong rules apply
    masked = Known(lengths, first=10_000, seed=4)
    return [
        (plain, str(plain.write(root / "plain", masked=False, shard_size=1500))),
        (masked, str(masked.write(root / "masked", masked=True))),
    ]


def token_ids(known: list[Known], sources: list[DatasetSource], source: int, addresses):
    """The ids a Known dataset holds at `addresses` (its ids count up from `first`)."""
    shards, offsets = split_addresses(addresses)
    starts = np.cumsum([0] + [e.num_tokens for e in sources[source].manifest.shards])
    return known[source].first + starts[shards] + offsets


def assert_same_rows(real_stream, address_stream, known, sources, limit=400):
    real, fake = real_stream.batcher.upstream, address_stream.batcher.upstream
    a, b = np.empty(real.window, np.int64), np.empty(real.window, np.int64)
    for count in range(limit):
        try:
            placed = real.next_into(a)
        except StopIteration:
            with pytest.raises(StopIteration):
                fake.next_into(b)
            return count
        assert fake.next_into(b) == placed
        assert fake.row_source == real.row_source
        length = placed[1]
        ids = split_flags(a[:length].astype(np.int32))[0] if real.row_masked else a[:length]
        assert np.array_equal(ids, token_ids(known, sources, real.row_source, b[:length]))
    return limit


OPTIONS = [
    dict(packing="concat"),
    dict(packing="concat", stride=31),
    dict(packing="concat", stride=5, shuffle_buffer=0),
    dict(packing="greedy", overlong="split", lookahead=3),
    dict(packing="greedy", overlong="truncate"),
    dict(packing="greedy", overlong="drop", interleave=1),
    dict(packing="bfd", overlong="split", bfd_window=20),
    dict(packing="bfd", overlong="truncate", bfd_window=7),
    dict(packing="bfd", overlong="drop"),
]


@pytest.mark.parametrize("which", [0, 1])
@pytest.mark.parametrize("extra", OPTIONS, ids=lambda o: "-".join(map(str, o.values())))
def test_one_dataset_packs_addresses_as_it_packs_tokens(data, extra, which):
    known, folder = data[which]
    options = StreamOptions(**{"seq_len": 31, "batch_size": 2, "shuffle_buffer": 12, **extra})
    setup = StreamSetup.single(DatasetSource(folder), options)
    addresses = setup.map_sources(AddressSource)
    placement = Placement(1, 2, 0, 1)
    rows = assert_same_rows(
        setup.stream(placement, epoch=1), addresses.stream(placement, epoch=1), [known],
        list(setup.sources),
    )  # fmt: skip
    assert rows >= 5


@pytest.mark.parametrize("packing", ["concat", "greedy", "bfd"])
def test_a_mix_of_masked_and_plain_data_packs_addresses_alike(data, packing):
    known = [k for k, _ in data]
    spec = mix_spec({data[0][1]: 0.5, data[1][1]: 0.5})
    setup = StreamSetup.mixed(spec, StreamOptions(seq_len=31, batch_size=2, packing=packing))
    addresses = setup.map_sources(AddressSource)
    placement = Placement(0, 1, 1, 2)
    # 400 rows: both sources run through several epochs
    assert_same_rows(setup.stream(placement, epoch=0), addresses.stream(placement, epoch=0),
                     known, list(setup.sources))  # fmt: skip


@pytest.mark.parametrize("packing", ["concat", "greedy"])
def test_an_elastic_remainder_packs_addresses_alike(data, packing):
    known, folder = data[0]
    options = StreamOptions(seq_len=15, batch_size=2, packing=packing, shuffle_buffer=6)
    setup = StreamSetup.single(DatasetSource(folder), options)
    states = []
    for w in range(3):
        stream = setup.stream(Placement(0, 1, w, 3), epoch=0)
        for _ in range(2 + w):
            next(stream)
        states.append(
            WorkerState(0, Placement(0, 1, w, 3), stream.state_dict(), setup.fingerprint).to_dict()
        )
    merged = parse_saved(merge_states(states))
    assert isinstance(merged, MergedState)
    addresses = setup.map_sources(AddressSource)
    placement = Placement(0, 1, 0, 2)
    rows = assert_same_rows(
        setup.stream(placement, epoch=0, resume=merged),
        addresses.stream(placement, epoch=0, resume=merged), [known], list(setup.sources),
    )  # fmt: skip
    assert rows > 10


def test_addresses_come_from_the_idx(data, monkeypatch):
    _, folder = data[1]
    source = AddressSource(DatasetSource(folder))
    name = source.manifest.shards[1].file
    monkeypatch.setattr(DatasetSource, "open_stream", None)  # no .bin is opened
    reader, file = source.open_stream(name, with_masks=True)
    docs = list(reader.documents(2, 5, with_masks=True))
    sizes = source.document_sizes(name)
    assert [len(d) for d in docs] == sizes[2:5].tolist()
    shards, offsets = split_addresses(np.concatenate(docs))
    assert (shards == 1).all() and offsets[0] == sizes[:2].sum()
    assert np.array_equal(np.diff(offsets), np.ones(len(offsets) - 1))
    assert reader.mask_source is None
    file.close()


@pytest.mark.parametrize("kind", ["mix", "single", "overlap"])
def test_passing_over_rows_in_runs_is_stepping_row_by_row(data, kind):
    folders = [folder for _, folder in data]
    options = StreamOptions(seq_len=15, batch_size=2, shuffle_buffer=12,
                            stride=7 if kind == "overlap" else None)  # fmt: skip
    if kind == "mix":  # runs per source, across several source epochs
        setup = StreamSetup.mixed(mix_spec({folders[0]: 0.6, folders[1]: 0.4}), options)
    else:
        setup = StreamSetup.single(DatasetSource(folders[0]), options)
    addresses = setup.map_sources(AddressSource)
    placement = Placement(0, 2, 1, 2)
    for rows in (0, 1, 37, 300 if kind == "mix" else 65):
        fast, slow = (addresses.stream(placement, epoch=0).batcher.upstream for _ in range(2))
        skip_rows(fast, rows)
        row = np.empty(16, np.int64)
        for _ in range(rows):
            slow.next_into(row)
        assert fast.state_dict() == slow.state_dict()
        a, b = np.empty(16, np.int64), np.empty(16, np.int64)
        for _ in range(3):
            assert fast.next_into(a) == slow.next_into(b) and np.array_equal(a, b)
