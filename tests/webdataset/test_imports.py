"""shardtok.webdataset is an optional extra: `import shardtok` never imports webdataset, the
stage runs without torch, and without webdataset the import says what to install."""

from __future__ import annotations

import subprocess
import sys

from tests.webdataset.conftest import shard_paths


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_import_shardtok_does_not_import_webdataset():
    result = run("import sys, shardtok, shardtok.format; print('webdataset' in sys.modules)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_the_stage_runs_without_torch(int32_dataset):
    code = (
        'import sys; sys.modules["torch"] = None\n'
        "import webdataset as wds, shardtok.webdataset as sw\n"
        f"urls = {shard_paths(int32_dataset)!r}\n"
        "print(sum(1 for _ in wds.WebDataset(urls, shardshuffle=False).compose(sw.documents())))"
    )
    result = run(code)
    assert result.returncode == 0, result.stderr
    from shardtok.dataset.source import DatasetSource

    assert int(result.stdout) == DatasetSource(int32_dataset).manifest.num_documents


def test_without_webdataset_the_import_names_the_extra():
    result = run('import sys; sys.modules["webdataset"] = None; import shardtok.webdataset')
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last == (
        "ImportError: shardtok.webdataset needs the webdataset package: "
        "pip install 'shardtok[webdataset]'"
    )
