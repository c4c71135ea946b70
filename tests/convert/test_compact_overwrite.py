"""--overwrite replaces a dataset of this release whole: index.compact is the writer's own file,
not a foreign one that would make the folder "not empty"."""

from __future__ import annotations

from shardtok.convert.job.output_dir import foreign_entries, prepare_new_dataset
from shardtok.testing.synthetic import write_synthetic_dataset


def test_overwrite_clears_index_compact_too(tmp_path):
    folder = tmp_path / "ds"
    write_synthetic_dataset(folder, num_tokens=5000, mean_length=200)
    assert (folder / "index.compact").exists()
    assert foreign_entries(folder, "shard") == []
    prepare_new_dataset(folder, overwrite=True)
    assert not (folder / "index.compact").exists() and not (folder / "index.json").exists()
