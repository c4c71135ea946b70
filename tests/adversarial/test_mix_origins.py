"""Class 2 for mixes: the storage options a user gives with a mix (whose file may come from
someone else) reach one origin only; a mix spanning origins needs options keyed by origin."""

from __future__ import annotations

import pytest

from shardtok.errors import UsageError
from shardtok.stream.mix.spec import load_mix_config, mix_spec

SECRET = {"headers": {"Authorization": "Bearer canary"}}


def test_flat_options_are_refused_for_a_mix_of_two_hosts():
    paths = {"https://127.0.0.1:9/ds": 1, "https://127.0.0.2:9/ds": 1}
    with pytest.raises(UsageError, match="would be sent to 2 origins") as caught:
        mix_spec(paths, SECRET)  # refused before any request is made
    assert "canary" not in str(caught.value)


def test_a_mix_file_cannot_route_the_users_options_elsewhere(tmp_path):
    config = tmp_path / "mix.yaml"
    config.write_text("dataset_path:\n  https://127.0.0.1:9/a: 1\n  https://127.0.0.2:9/b: 1\n")
    with pytest.raises(UsageError, match="key them by origin"):
        load_mix_config(config, storage_options=SECRET)


def test_options_keyed_by_origin_go_to_that_origin_only(tmp_path):
    spec = mix_spec(
        {"https://127.0.0.1:9/a": 1, "https://127.0.0.2:9/b": 1, str(tmp_path): 1},
        {"https://127.0.0.1:9": SECRET},
    )
    assert [s.storage_options for s in spec.sources] == [SECRET, {}, {}]


def test_one_origin_keeps_the_flat_options():
    spec = mix_spec({"https://127.0.0.1:9/a": 1, "https://127.0.0.1:9/b": 2}, SECRET)
    assert [s.storage_options for s in spec.sources] == [SECRET, SECRET]
