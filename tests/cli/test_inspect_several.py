"""`shardtok inspect A B`: several dataset folders, each summarized as it would be alone."""

from __future__ import annotations

import json

from shardtok.cli.main import main
from shardtok.testing.synthetic import write_synthetic_dataset


def test_two_dataset_folders_are_inspected_one_after_the_other(tmp_path, capsys):
    web, code = tmp_path / "web", tmp_path / "code"
    write_synthetic_dataset(web, num_tokens=20_000, mean_length=300, seed=1)
    write_synthetic_dataset(code, num_tokens=9_000, mean_length=200, seed=2)
    alone = {}
    for folder in (web, code):
        assert main(["inspect", str(folder), "--json"]) == 0
        alone[folder] = json.loads(capsys.readouterr().out)
    assert main(["inspect", str(web), str(code), "--json"]) == 0
    both = json.loads(capsys.readouterr().out)
    assert both == [alone[web], alone[code]]
    assert both[0]["num_tokens"] != both[1]["num_tokens"]
    assert main(["inspect", str(web), str(code)]) == 0
    out = capsys.readouterr().out
    assert f"dataset {web} (" in out and f"dataset {code} (" in out
    assert out.index(f"dataset {web} (") < out.index(f"dataset {code} (")
    # a folder beside one shard file of another dataset: each as it would be read alone
    shard = str(code / "shard-000000.tar")
    assert main(["inspect", str(web), shard, "--json"]) == 0
    kinds = [s["kind"] for s in json.loads(capsys.readouterr().out)]
    assert kinds[0] == "dataset" and len(kinds) == 2
    assert main(["inspect", str(web), str(tmp_path / "nothing")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.endswith("nothing: no such file or folder") and "\n" not in err
