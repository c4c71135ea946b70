"""The phases' derived files as someone else's: a plan.json whose unit list or job name was
edited, and a unit marker whose frame table disagrees with its frames, are refused in one line,
never merged into a dataset that is missing documents or that `shardtok verify` fails."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from shardtok.convert import RunOptions, convert
from shardtok.convert.engines import ranks
from shardtok.convert.job import phases
from shardtok.convert.job.merge import UnitsNotReadyError
from shardtok.convert.job.plan_file import PlanError
from shardtok.convert.job.spec import plan_digest
from shardtok.convert.job.workdir import WORK_DIR_NAME
from shardtok.errors import UsageError
from tests.convert.test_determinism import small_options as options
from tests.convert.test_determinism import tree_digest, write_corpus

QUIET = RunOptions(progress=False)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    write_corpus(folder / "part-a.jsonl", 300, seed=3)
    write_corpus(folder / "part-b.jsonl", 150, seed=4)
    return folder


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("ref") / "out"
    convert(options(corpus, out), RunOptions(workers=1, progress=False))
    return tree_digest(out)


@pytest.fixture(scope="module")
def finished(corpus, tmp_path_factory) -> Path:
    """A planned output with every unit run, not merged."""
    out = tmp_path_factory.mktemp("finished") / "out"
    phases.plan(options(corpus, out), QUIET)
    ranks.run_units(str(out), 0, 1, progress=False)
    return out


def copy_of(finished: Path, tmp_path: Path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    return out


def edit_plan(out: Path, edit, *, digest: bool = False) -> None:
    """Change plan.json by `edit(doc)`; `digest`: and make its fingerprint's digest agree, as
    a careful editor would."""
    plan = out / WORK_DIR_NAME / "plan.json"
    doc = json.loads(plan.read_text())
    edit(doc)
    if digest:
        doc["fingerprint"]["plan"] = plan_digest(doc["job"]["name"], doc["job"]["units"])
    plan.write_text(json.dumps(doc))


def renumber(units: list) -> None:
    for i, unit in enumerate(units):
        unit[0] = i


def drop_unit(doc, at=1):
    del doc["job"]["units"][at]
    renumber(doc["job"]["units"])


def repeat_unit(doc, at=1):
    units = doc["job"]["units"]
    units.insert(at, json.loads(json.dumps(units[at])))
    renumber(units)


def verify_passes(out: Path) -> bool:
    found = subprocess.run(
        [sys.executable, "-m", "shardtok", "verify", str(out)], capture_output=True, text=True
    )
    return found.returncode == 0


def refused(out: Path, error=PlanError) -> str:
    """The one-line error of run-units (when the plan is at fault) and merge; no dataset."""
    calls = [lambda: phases.merge(str(out), progress=False)]
    if error is PlanError:
        calls.insert(0, lambda: ranks.run_units(str(out), 0, 1, progress=False))
    for call in calls:
        with pytest.raises(error) as caught:
            call()
        text = str(caught.value)
        assert "\n" not in text
    assert not (out / "index.json").exists()
    return text


def move_cut(doc):
    """The cut between units 0 and 1 moved off its line start: the ranges still tile."""
    units = doc["job"]["units"]
    units[0][2][-1][2] -= 10
    units[1][2][0][1] -= 10


def test_an_edited_unit_list_disagrees_with_the_fingerprint(finished, tmp_path):
    out = copy_of(finished, tmp_path)
    edit_plan(out, move_cut)
    assert "the job disagrees with the plan's fingerprint" in refused(out)


@pytest.mark.parametrize(
    "edit, message",
    [
        (drop_unit, "job.units[1] piece 0 is not its file's next range"),
        (repeat_unit, "job.units[2] piece 0 is not its file's next range"),
        (lambda doc: drop_unit(doc, -1), "job.inputs[1] is not covered by the units"),
        (
            lambda doc: doc["job"]["units"].reverse() or renumber(doc["job"]["units"]),
            "takes an input file out of order",
        ),
    ],
    ids=["dropped", "repeated", "last-dropped", "reversed"],
)
def test_a_unit_list_that_does_not_cover_the_inputs_is_refused(finished, tmp_path, edit, message):
    """Even when whoever edited it made the digest agree."""
    out = copy_of(finished, tmp_path)
    edit_plan(out, edit, digest=True)
    text = refused(out)
    assert message in text, text
    assert text.startswith(str(out / WORK_DIR_NAME / "plan.json"))


def test_a_plan_from_before_the_digest_is_read_as_before(finished, reference, tmp_path):
    out = copy_of(finished, tmp_path)
    edit_plan(out, lambda doc: doc["fingerprint"].pop("plan"))
    phases.merge(str(out), progress=False)
    assert tree_digest(out) == reference


@pytest.mark.parametrize("name", ["..", ".hidden", "a..b", "a b", "x" * 250, "sub/x", ""])
def test_a_job_name_that_makes_no_plain_shard_name_is_refused(finished, tmp_path, name):
    out = copy_of(finished, tmp_path)
    edit_plan(out, lambda doc: doc["job"].update(name=name), digest=True)
    assert "job.name must be a plain file name prefix" in refused(out)


def test_plan_refuses_such_a_name_up_front(corpus, tmp_path):
    with pytest.raises(UsageError, match=r"--name must be a plain file name prefix"):
        phases.plan(options(corpus, tmp_path / "out", name=".."), QUIET)
    assert not (tmp_path / "out" / WORK_DIR_NAME / "plan.json").exists()


def edit_marker(out: Path, index: int, edit) -> None:
    marker = out / WORK_DIR_NAME / f"unit-{index:06d}.json"
    doc = json.loads(marker.read_text())
    edit(doc)
    marker.write_text(json.dumps(doc, sort_keys=True))


def flip_crc(doc):
    doc["frames"][0][3] ^= 1 << 7


def swap_sizes(doc):
    """Two frames' uncompressed sizes exchanged: the sums still hold."""
    frames = doc["frames"]
    assert len(frames) > 1
    frames[0][1], frames[1][1] = frames[1][1], frames[0][1]


def shift_first_document(doc):
    doc["frames"][1][0] += 1


@pytest.mark.parametrize(
    "edit", [flip_crc, swap_sizes, shift_first_document], ids=["crc", "sizes", "documents"]
)
def test_a_marker_whose_frame_table_disagrees_with_its_frames(finished, reference, tmp_path, edit):
    out = copy_of(finished, tmp_path)
    edit_marker(out, 2, edit)
    text = refused(out, UnitsNotReadyError)
    assert "unit-000002.json is damaged" in text and "frame table" in text, text
    # The unit went back to run-units, which makes it again; then the merge is the reference.
    assert ranks.run_units(str(out), 0, 1, progress=False).tokenized == 1
    phases.merge(str(out), progress=False)
    assert tree_digest(out) == reference
    assert verify_passes(out)
