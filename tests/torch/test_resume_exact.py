"""Exact resume through torchdata's StatefulDataLoader, restored in a fresh process.

N batches uninterrupted == k batches, state, (new process) restore, N - k batches, bit for bit:
for 0 and 2 workers, world size 1 and 2 (both ranks), concat and greedy packing, a single dataset
mid-epoch and across an epoch boundary, and a three-source mix whose small source crosses its
own epoch boundaries. One child process restores every case (one interpreter start).
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from shardtok.errors import ResumeStateError
from tests.helpers.resume_cases import (
    as_arrays,
    epochs_of,
    make_dataset,
    make_loader,
    write_datasets,
)

HERE = Path(__file__).parent
SAVE_AFTER = 7  # batches: odd, so with 2 workers the round robin is mid-cycle
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")
CASES = [
    {"workers": w, "world": world, "rank": rank, "packing": p, "kind": kind}
    for w, (world, rank), p, kind in itertools.product(
        (0, 2), ((1, 0), (2, 0), (2, 1)), ("concat", "greedy"), ("mid", "boundary", "mix")
    )
]


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return write_datasets(tmp_path_factory.mktemp("resume"))


def uninterrupted_with_state(paths, case):
    """The whole run, and the loader state (plus epoch) taken after k batches along the way."""
    loader = make_loader(paths, case)
    batches, state, k = [], None, None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for epoch in range(epochs_of(case)):
            loader.dataset.set_epoch(epoch)
            epoch_batches = [as_arrays(b) for b in loader] if epoch else []
            if epoch == 0:
                it = iter(loader)
                for b in it:
                    epoch_batches.append(as_arrays(b))
                    if state is None and len(epoch_batches) == SAVE_AFTER:
                        state, k = loader.state_dict(), SAVE_AFTER
            batches.extend(epoch_batches)
    assert state is not None
    return batches, state, k


def test_restore_in_a_fresh_process_is_bit_exact(paths, tmp_path):
    saved, references = [], []
    for case in CASES:
        batches, state, k = uninterrupted_with_state(paths, case)
        saved.append((case, state, 0))
        references.append((batches, k))
    cases_file, out_file = tmp_path / "cases.pt", tmp_path / "out.pt"
    torch.save({"paths": paths, "cases": saved}, cases_file)
    subprocess.run(
        [
            sys.executable,
            str(HERE.parent / "helpers" / "resume_worker.py"),
            str(cases_file),
            str(out_file),
        ],
        check=True,
        timeout=300,
    )
    restored = torch.load(out_file, weights_only=False)
    counts: dict[tuple, set[int]] = {}
    for case, (reference, k), rest in zip(CASES, references, restored, strict=True):
        where = f"{case}: k={k}"
        assert len(reference) > k + 2, where  # the save point lies inside the run
        assert len(rest) == len(reference) - k, where
        for i, (got, want) in enumerate(zip(rest, reference[k:], strict=True)):
            for key in want:
                assert np.array_equal(got[key], want[key]), f"{where}: batch {k + i} {key}"
        counts.setdefault(
            (case["kind"], case["world"], case["workers"], case["packing"]), set()
        ).add(len(reference))
    # every rank of a world yields the same number of batches
    assert all(len(v) == 1 for v in counts.values()), counts


def test_a_state_for_other_data_or_options_is_refused(paths):
    case = {"workers": 0, "world": 1, "rank": 0, "packing": "concat", "kind": "mix"}
    dataset = make_dataset(paths, case)
    next(iter(dataset))
    state = dataset.state_dict()
    other = make_dataset(paths, {**case, "packing": "greedy"})
    with pytest.raises(ResumeStateError, match="option packing: 'concat' saved, 'greedy' now"):
        other.load_state_dict(state)
    other.load_state_dict(state, strict=False)  # explicitly overridden: resumes anyway
    single = make_dataset(paths, {**case, "kind": "mid"})
    with pytest.raises(ResumeStateError, match="3 sources saved, 1 now"):
        single.load_state_dict(state)
