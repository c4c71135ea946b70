# ruff: noqa: F811 (the fixtures imported below are parameters of the test)
"""Hypothesis edits plan.json of a finished run-units: whatever it does, the phases either
refuse in one line (a ShardtokError) or write exactly the reference dataset; never one that is
missing or doubling documents, or that fails its own checks."""

from __future__ import annotations

import json
import shutil

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardtok.convert.engines import ranks
from shardtok.convert.job import phases
from shardtok.convert.job.spec import plan_digest
from shardtok.convert.job.workdir import WORK_DIR_NAME
from shardtok.errors import ShardtokError
from tests.adversarial.test_phase_files import (  # noqa: F401 (fixtures)
    corpus,
    finished,
    reference,
    renumber,
)
from tests.convert.test_determinism import tree_digest


def _units(doc):
    return doc["job"]["units"]


def _drop(doc, i):
    del _units(doc)[i % len(_units(doc))]
    renumber(_units(doc))


def _repeat(doc, i):
    units = _units(doc)
    units.insert(i % len(units), json.loads(json.dumps(units[i % len(units)])))
    renumber(units)


def _swap(doc, i):
    units = _units(doc)
    a, b = i % len(units), (i + 1) % len(units)
    units[a], units[b] = units[b], units[a]
    renumber(units)


def _shift(doc, i):
    pieces = [p for u in _units(doc) for p in u[2]]
    piece = pieces[i % len(pieces)]
    piece[1 + i % 2] = max(0, piece[1 + i % 2] + (i % 7) - 3)


def _name(doc, i):
    doc["job"]["name"] = ["..", ".", "a/b", "shard", "other", "x" * 250][i % 6]


def _nbytes(doc, i):
    _units(doc)[i % len(_units(doc))][1] += 1


MUTATORS = [_drop, _repeat, _swap, _shift, _name, _nbytes]


@settings(
    max_examples=25, deadline=None, derandomize=True,  # the same examples on every run
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)  # fmt: skip
@given(
    edits=st.lists(
        st.tuples(st.sampled_from(MUTATORS), st.integers(0, 1000)), min_size=1, max_size=3
    ),
    redigest=st.booleans(),
)
def test_an_edited_plan_is_refused_or_gives_the_reference(
    finished,
    reference,
    tmp_path_factory,
    edits,
    redigest,  # noqa: F811 (fixtures)
):
    out = tmp_path_factory.mktemp("fuzz") / "out"
    shutil.copytree(finished, out)
    plan = out / WORK_DIR_NAME / "plan.json"
    doc = json.loads(plan.read_text())
    for mutate, i in edits:
        mutate(doc, i)
    if redigest:  # an editor who knows the digest: the structural checks must hold alone
        doc["fingerprint"]["plan"] = plan_digest(doc["job"]["name"], _units(doc))
    plan.write_text(json.dumps(doc))
    try:
        ranks.run_units(str(out), 0, 1, progress=False)
        phases.merge(str(out), progress=False)
    except ShardtokError as exc:
        assert "\n" not in str(exc)
        assert not (out / "index.json").exists()
        return
    found = tree_digest(out)
    if doc["job"]["name"] != "shard":  # a valid new name: the same shards under it
        found = {k.replace(doc["job"]["name"], "shard", 1): v for k, v in found.items()}
        assert set(found) == set(reference)
        return
    assert found == reference
