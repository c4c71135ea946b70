"""Reading a unit ahead (unit_reader.ReadAhead): the writer thread reads the next unit while the
tokenizing thread encodes this one. What the tokenizing thread then sees is what reading in
place gives (records, rejects, an input error at the same point); a read not yet started is
the tokenizing thread's own; and a worker serving units reads ahead without changing a byte."""

from __future__ import annotations

import gzip
import json
import multiprocessing
import threading
from types import SimpleNamespace

import pytest

from shardtok.convert import ConvertJob, load_tokenizer
from shardtok.convert.inputs import records
from shardtok.convert.inputs.files import InputError, discover
from shardtok.convert.inputs.records import Reject, TextRun
from shardtok.convert.inputs.table_pieces import BlockCache
from shardtok.convert.inputs.units import InputRange, Unit, plan_units
from shardtok.convert.job.failures import UnitFailure
from shardtok.convert.job.spec import WorkerConfig
from shardtok.convert.job.workdir import WORK_DIR_NAME
from shardtok.convert.sft.config import load_sft_config
from shardtok.convert.sft.setup import prepare_sft
from shardtok.convert.worker import process as worker
from shardtok.convert.worker import unit_reader
from shardtok.convert.worker.unit_reader import PieceReader, ReadAhead, reads_ahead
from tests.convert.test_determinism import tree_digest, write_corpus
from tests.helpers.sft_data import special_tokenizer


def _flat(entries) -> list:
    out = []
    for entry in entries:
        if isinstance(entry, TextRun):
            out += [("text", n, t) for n, t in zip(entry.numbers, entry.texts)]
        else:
            record, item = entry
            out.append(("reject", record, item.reason) if isinstance(item, Reject) else entry)
    return out


def _collect(pieces) -> tuple[list, list[int], str | None]:
    """Entries, records per piece and the input error, as tokenize takes them."""
    entries, records = [], []
    for piece in pieces:
        try:
            for entry in piece:
                entries.append(entry)
        except InputError as exc:
            return _flat(entries), records, str(exc)
        records.append(piece.records)
    return _flat(entries), records, None


def _in_place(config, unit: Unit) -> tuple[list, list[int], str | None]:
    """What reading on this thread gives, as tokenize reads a unit not read ahead."""
    blocks = BlockCache()
    return _collect(PieceReader(config, p, False, None, blocks) for p in unit.pieces)


@pytest.fixture
def two_files(tmp_path, monkeypatch) -> tuple[SimpleNamespace, Unit]:
    """A unit of two pieces: JSONL with rejects and a blank line, then a truncated .gz (read
    in chunks of ~300 bytes of lines, so records come before the break)."""
    monkeypatch.setattr(records, "_CHUNK_BYTES", 300)
    good = tmp_path / "a.jsonl"
    good.write_bytes(b'{"text": "one"}\n\n{"text": 5}\n{"text": "two"}\n{oops\n{"text": "3"}\n')
    cut = tmp_path / "b.jsonl.gz"
    body = b"".join(b'{"text": "doc %d"}\n' % i for i in range(100_000))  # > 1 MiB decoded
    cut.write_bytes(gzip.compress(body)[:-300])
    files = discover([str(good), str(cut)])
    job = SimpleNamespace(text_key="text", txt_mode="lines")
    config = SimpleNamespace(job=job, files=tuple(files), storage_options=None)
    pieces = (InputRange(0, 0, files[0].size), InputRange(1, 0, files[1].size))
    return config, Unit(0, pieces, sum(f.size for f in files))


def test_read_ahead_replays_what_reading_in_place_gives(two_files):
    config, unit = two_files
    expected = _in_place(config, unit)
    entries, records, error = expected
    assert ("reject", 3, "not_a_string") in entries and ("reject", 5, "invalid_json") in entries
    assert ("text", 1, "doc 0") in entries and records == [6]  # the .gz read until it breaks
    assert error is not None and "b.jsonl.gz, byte offset" in error and "cut short" in error
    ahead = ReadAhead(unit, config, False, None, BlockCache())
    ahead.run()  # on the writer thread in a worker; it never raises
    assert _collect(ahead.take()) == expected


def test_a_read_not_started_is_the_tokenizing_threads(two_files):
    config, unit = two_files
    ahead = ReadAhead(unit, config, False, None, BlockCache())
    assert ahead.take() is None  # the caller reads in place
    ahead.run()  # the writer thread comes too late: nothing is read twice
    assert ahead._pieces is None and not ahead._done.is_set()


def test_a_read_ahead_failing_for_no_reason_of_the_inputs_leaves_the_unit_to_be_read_in_place(
    two_files, monkeypatch
):
    config, unit = two_files
    ahead = ReadAhead(unit, config, False, None, BlockCache())
    monkeypatch.setattr(unit_reader, "_ReadPiece", None)  # any failure outside a piece's read
    ahead.run()
    assert ahead.take() is None


def test_only_small_units_of_plain_jsonl_or_text_are_read_ahead(tmp_path):
    """A unit read ahead is held whole: a compressed file (one piece, whatever its size), a
    Parquet or Arrow block, or a unit over MAX_AHEAD_BYTES is read in place, streamed."""
    names = ["a.jsonl", "b.txt", "c.jsonl.gz", "d.jsonl.zst", "e.parquet"]
    files = [SimpleNamespace(path=n, kind=n.split(".")[1], compression=None) for n in names]
    files[2].compression, files[3].compression = "gzip", "zstd"

    def unit(*indexes, nbytes=1000):
        return Unit(0, tuple(InputRange(i, 0, 10) for i in indexes), nbytes)

    assert reads_ahead(unit(0, 1), files)
    assert reads_ahead(unit(0, nbytes=unit_reader.MAX_AHEAD_BYTES), files)
    assert not reads_ahead(unit(0, nbytes=unit_reader.MAX_AHEAD_BYTES + 1), files)
    for i in (2, 3, 4):
        assert not reads_ahead(unit(0, i), files), names[i]


def test_a_read_under_way_is_waited_for(two_files, monkeypatch):
    config, unit = two_files
    started, release = threading.Event(), threading.Event()
    real = PieceReader.__init__

    def slow_init(self, *args):
        started.set()
        release.wait()
        real(self, *args)

    monkeypatch.setattr(PieceReader, "__init__", slow_init)
    ahead = ReadAhead(unit, config, False, None, BlockCache())
    writer = threading.Thread(target=ahead.run)
    writer.start()
    started.wait()
    taken: list = []
    tokenizer = threading.Thread(target=lambda: taken.append(ahead.take()))
    tokenizer.start()
    tokenizer.join(0.2)
    assert tokenizer.is_alive() and not taken  # waiting, not reading the unit itself
    release.set()
    writer.join()
    tokenizer.join()
    monkeypatch.setattr(PieceReader, "__init__", real)
    assert _collect(taken[0]) == _in_place(config, unit)


def _serve(config, units: list[Unit]) -> list:
    """serve_units in this process with every unit already on its pipe, so each unit is read
    ahead while the one before it is encoded; the outcomes by unit index."""
    tasks_r, tasks_w = multiprocessing.Pipe(duplex=False)
    results_r, results_w = multiprocessing.Pipe(duplex=False)
    for i, unit in enumerate(units):
        tasks_w.send((i, unit, None))
    tasks_w.send(None)
    outcomes: dict = {}

    def collect() -> None:
        while len(outcomes) < len(units):
            task_id, outcome, error = results_r.recv()
            outcomes[task_id] = error if error is not None else outcome

    collector = threading.Thread(target=collect)
    collector.start()
    try:
        worker.serve_units(config, tasks_r, results_w)
    finally:
        worker._sink_of = None  # serve_units closed its writer, as a worker process ends
    collector.join()
    return [outcomes[i] for i in range(len(units))]


def _sft_corpus(tmp_path, path):
    """ShareGPT records (their settings, their tokenizer) with a bad record at line 151."""
    records = [
        {"conversations": [{"from": "human", "value": f"question {i} " * (i % 40 + 1)},
                           {"from": "gpt", "value": f"answer {i} " * (i % 30 + 1)}]}
        for i in range(300)
    ]  # fmt: skip
    lines = [json.dumps(r) for r in records]
    lines[150] = '{"conversations": oops}'
    path.write_text("\n".join(lines) + "\n")
    tok = special_tokenizer(tmp_path / "tok")
    spec = load_tokenizer(str(tok), append_eos=False, backend="hf")
    (tmp_path / "sft.yaml").write_text("format: sharegpt\ntemplate: chatml\n")
    return spec, prepare_sft(load_sft_config(tmp_path / "sft.yaml", {}), spec, tok)


@pytest.mark.parametrize("kind", ["text", "sft"])
@pytest.mark.parametrize("on_bad_record", ["skip", "error"])
def test_a_worker_reading_ahead_persists_what_reading_in_place_does(
    tmp_path, monkeypatch, on_bad_record, kind
):
    corpus = tmp_path / "c.jsonl"
    if kind == "sft":
        spec, sft = _sft_corpus(tmp_path, corpus)
    else:
        spec, sft = load_tokenizer("bundled"), None
        write_corpus(corpus, 300, seed=5)
        lines = corpus.read_text().splitlines()
        lines[150] = '{"text": oops}'  # a bad record in a later unit
        corpus.write_text("\n".join(lines) + "\n")
    files = discover([str(corpus)])
    units = plan_units(files, 8 << 10, "lines")
    assert len(units) > 6
    # Each read ahead is let finish before it is taken (the writer thread would otherwise
    # often start it too late with units this small, and the tokenizer read in place).
    taken: list = []
    real_take = ReadAhead.take

    def take(self):
        self._done.wait()
        taken.append(real_take(self))
        return taken[-1]

    monkeypatch.setattr(ReadAhead, "take", take)
    trees, outcomes = [], []
    for ahead in (True, False):
        out = tmp_path / f"out-{ahead}"
        (out / WORK_DIR_NAME).mkdir(parents=True)
        job = ConvertJob(inputs=(str(corpus),), output=str(out), tokenizer=spec, sft=sft,
                         on_bad_record=on_bad_record)  # fmt: skip
        config = WorkerConfig(job, tuple(files))
        if ahead:
            outcomes.append(_serve(config, units))
        else:
            worker.init_worker(config)
            outcomes.append([worker.tokenize_unit(unit) for unit in units])  # no read-ahead there
        trees.append(tree_digest(out / WORK_DIR_NAME))
    # every unit but the first was read ahead; in error mode, not the one after the bad
    # record's (its unit stops there)
    assert len(taken) == len(units) - 1 - (on_bad_record == "error")
    assert all(t is not None for t in taken)
    assert trees[0] == trees[1]
    assert [type(o) for o in outcomes[0]] == [type(o) for o in outcomes[1]]
    failures = [o for o in outcomes[0] if isinstance(o, UnitFailure)]
    assert len(failures) == (on_bad_record == "error")
    assert outcomes[0] == outcomes[1]
