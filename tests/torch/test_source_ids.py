"""Every batch names each row's source (``source_ids``, an int64 tensor [B]) on every path: in
process (with and without shared memory), DataLoader workers, ShardLoader workers under fork
and spawn (slots, and pickled without shared memory), the memmap path, and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from shardtok.cli.main import run as main
from shardtok.testing.synthetic import write_synthetic_dataset
from shardtok.torch import MemmapTokenDataset, ShardLoader, ShardStreamDataset

OPTIONS = dict(seq_len=15, batch_size=4, shuffle_buffer=8, seed=3)
BASES = [1, 1_000_000]  # source i's token ids start at BASES[i]


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("source_ids")
    paths = []
    for i, base in enumerate(BASES):
        lengths = [int(n) for n in np.random.default_rng(i).integers(1, 50, size=80 - 30 * i)]
        write_synthetic_dataset(
            root / f"s{i}", lengths=lengths, vocab_size=1 << 21, unique_tokens=True,
            first_token=base, shard_size=500, frame_size=200, compression_level=None,
        )  # fmt: skip
        paths.append(str(root / f"s{i}"))
    return paths


def mix(sources, **kwargs) -> ShardStreamDataset:
    return ShardStreamDataset({sources[0]: 0.6, sources[1]: 0.4}, num_batches=10, **OPTIONS,
                              **kwargs)  # fmt: skip


def check(batches, single: bool = False) -> list[int]:
    """Each batch's source_ids is an int64 tensor naming the source its row's tokens come from."""
    assert batches
    named = []
    for batch in batches:
        ids, rows = batch["source_ids"], len(batch["input_ids"])  # a memmap batch may be short
        assert isinstance(ids, torch.Tensor) and ids.dtype == torch.int64 and ids.shape == (rows,)
        owners = (batch["input_ids"][:, 0] >= BASES[1]).long()
        assert torch.equal(ids, torch.zeros(rows, dtype=torch.int64) if single else owners)
        named += ids.tolist()
    assert single or set(named) == {0, 1}
    return named


@pytest.mark.parametrize("shared_memory", [True, False])
def test_in_process_and_dataloader_workers(sources, shared_memory):
    want = check(list(mix(sources, shared_memory=shared_memory)))
    workers = DataLoader(mix(sources, shared_memory=shared_memory, num_workers=2),
                         batch_size=None, num_workers=2)  # fmt: skip
    assert len(check(list(workers))) == len(want)


@pytest.mark.parametrize(
    "method, shared_memory", [("fork", True), ("fork", False), ("spawn", True)]
)
def test_shard_loader_workers(sources, method, shared_memory):
    workers = 1 if method == "spawn" else 2  # a spawned worker imports torch: 2 s each
    loader = ShardLoader(mix(sources, shared_memory=shared_memory), num_workers=workers,
                         multiprocessing_context=method)  # fmt: skip
    check(list(loader))


def test_one_dataset_and_the_memmap_path_name_source_0(sources):
    check(list(ShardLoader(ShardStreamDataset(sources[1], **OPTIONS), num_workers=2)), True)
    memmap = MemmapTokenDataset(sources[0], seq_len=15)
    check(list(DataLoader(memmap, batch_size=4, collate_fn=memmap.collate)), True)
    sample = memmap[3]
    assert sample["source_ids"].shape == () and int(sample["source_ids"]) == 0


def test_cli_shares_and_dump_for_any_engine(sources, tmp_path, capsys):
    """--num-workers 2 through a DataLoader and in process (--state-out keeps the worker
    streams here): the same batches, source_ids and shares."""
    args = ["stream", "--source", f"{sources[0]}:0.6", "--source", f"{sources[1]}:0.4",
            "--seq-len", "15", "--batch-size", "4", "--max-batches", "10", "--json",
            "--num-workers", "2"]  # fmt: skip
    runs = {}
    for engine, extra in (("loader", []), ("in process", ["--state-out", str(tmp_path / "s")])):
        dump = tmp_path / f"{len(extra)}.npz"
        assert main([*args, "--dump", str(dump), *extra]) == 0
        stats = json.loads(capsys.readouterr().out)
        assert stats["engine"].startswith("DataLoader" if engine == "loader" else "in process")
        runs[engine] = stats["sources"], np.load(dump)
    (loader, a), (here, b) = runs["loader"], runs["in process"]
    assert a["source_ids"].shape == (10, 4)
    assert np.array_equal(a["source_ids"], a["input_ids"][:, :, 0] >= BASES[1])
    assert all(np.array_equal(a[k], b[k]) for k in a.files if k != "plan")
    assert [row.pop("epochs") for row in here] == [[0, 0], [0, 0]]  # in process only
    assert loader == here
    assert [s["sequences"] for s in loader] == [24, 16]
    assert [s["weight"] for s in loader] == [0.6, 0.4]
