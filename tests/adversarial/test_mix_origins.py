"""Class 2 for mixes: the storage options a user gives with a mix (whose file may come from
someone else) reach one origin only; a mix spanning origins needs options keyed by origin."""

from __future__ import annotations

import shutil

import pytest

from shardtok.dataset.source import DatasetSource
from shardtok.errors import UsageError
from shardtok.storage.location import Location
from shardtok.storage.origins import options_by_origin
from shardtok.stream.mix.spec import load_mix_config, mix_spec
from shardtok.stream.mix.stages import load_curriculum
from shardtok.testing.synthetic import write_synthetic_dataset
from tests.helpers.origins import CANARY_HEADER, logged, origins, seen_headers  # noqa: F401

SECRET = {"headers": {"Authorization": "Bearer canary"}}
CANARY = "canary-mix-5e0a"


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


# -- through real servers: the caller's origin (127.0.0.1) and one a config names (127.0.0.2) --


@pytest.fixture(scope="module")
def published(origins, tmp_path_factory):  # noqa: F811
    """One small dataset, public on both origins (a config could name either)."""
    folder = tmp_path_factory.mktemp("mix-origins") / "ds"
    write_synthetic_dataset(folder, num_tokens=4000, vocab_size=1000, mean_length=100)
    for server in (origins.home, origins.other):
        shutil.copytree(folder, server.root / "mixds", dirs_exist_ok=True)
    return origins.home.url("mixds"), origins.other.url("mixds")


def _canary_options() -> dict:
    return {"headers": {"Authorization": f"Bearer {CANARY}", CANARY_HEADER: CANARY}}


def _read(where: str, options_for) -> DatasetSource:
    source = DatasetSource(where, options_for(Location(where)))
    assert source.manifest.num_tokens > 0
    return source


def test_flat_options_never_reach_a_host_a_config_names(origins, published):  # noqa: F811
    home, other = published
    # The config names the other host alone (no second origin to trip over) or after home.
    for names in ([other], [home, other]):
        options_for = options_by_origin(_canary_options(), from_config=True)
        with pytest.raises(UsageError) as caught:
            for where in names:
                _read(where, options_for)
        text = str(caught.value)
        assert text.startswith(f"{names[0]}: named by a config file") and "by origin" in text
        assert CANARY not in text and "\n" not in text
    # Refused before any request: neither host saw the header (nor, here, any request).
    assert CANARY not in seen_headers(origins.other) + seen_headers(origins.home)


def test_keyed_options_reach_the_callers_origin_only(origins, published):  # noqa: F811
    home, other = published
    home_origin = home.rsplit("/", 1)[0]
    options_for = options_by_origin({home_origin: _canary_options()}, from_config=True)
    _read(home, options_for), _read(other, options_for)
    assert CANARY in logged(origins.home, lambda log: CANARY in log)
    seen = logged(origins.other, lambda log: "/mixds/index.json" in log)
    assert "/mixds/index.json" in seen and CANARY not in seen
    # Locations the caller names itself: flat options serve the first one's origin only.
    options_for = options_by_origin(_canary_options())
    _read(home, options_for)
    with pytest.raises(UsageError, match="would be sent to 2 origins"):
        _read(other, options_for)
    assert CANARY not in seen_headers(origins.other)


CONFIG_CANARY = "canary-config-91d3"  # its own value: a leak is this test's alone


def test_a_config_file_never_routes_flat_options_to_its_hosts(tmp_path, origins, published):  # noqa: F811
    home, other = published
    flat = {"headers": {CANARY_HEADER: CONFIG_CANARY}}
    one = tmp_path / "one.yaml"
    one.write_text(f"dataset_path: {other}\n")
    staged = tmp_path / "staged.yaml"
    staged.write_text(
        "data_stages:\n"
        f"  - {{name: a, start_training_step: 1, data: {{dataset: {{dataset_path: {home}}}}}}}\n"
        f"  - {{name: b, start_training_step: 5, data: {{dataset: {{dataset_path: {other}}}}}}}\n"
    )
    for load in (
        lambda: load_mix_config(one, storage_options=flat).sources,
        lambda: load_curriculum(staged, storage_options=flat).sources,
    ):
        with pytest.raises(UsageError, match="key them by origin"):
            for source in load():
                _ = source.manifest
    assert CONFIG_CANARY not in seen_headers(origins.other)
