"""`shardtok inspect` names both manifests, their sizes and whether they agree."""

from __future__ import annotations

import json

from shardtok.cli.main import main
from shardtok.testing.synthetic import write_synthetic_dataset


def test_inspect_shows_both_manifests_and_whether_they_agree(tmp_path, capsys):
    folder = tmp_path / "ds"
    write_synthetic_dataset(folder, num_tokens=20_000, mean_length=300, shard_size=8000,
                            frame_size=4096)  # fmt: skip
    index = folder / "index.json"
    assert main(["inspect", str(folder)]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith(f"  manifests       index.json {index.stat().st_size:,} bytes; ")
    assert f"index.compact {(folder / 'index.compact').stat().st_size:,} bytes, agrees" in line
    text = index.read_text()  # edited to the same size, which a worker's check cannot see
    index.write_text(text.replace(json.loads(text)["shards"][0]["sha256"], "f" * 64))
    assert main(["inspect", str(folder), "--json"]) == 1
    compact = json.loads(capsys.readouterr().out)["manifests"]["index.compact"]
    assert not compact["agrees"] and "shard 0 (shard-000000.tar) differs" in compact["differences"]
    (folder / "index.compact").unlink()  # a dataset of an earlier release
    assert main(["inspect", str(folder)]) == 0
    assert "no index.compact (a dataset of an earlier release" in capsys.readouterr().out


def test_verify_names_a_bad_index_compact_and_still_checks_every_shard(tmp_path, capsys):
    folder = tmp_path / "ds"
    write_synthetic_dataset(folder, num_tokens=20_000, mean_length=300, shard_size=8000,
                            frame_size=4096)  # fmt: skip
    shards = json.loads((folder / "index.json").read_text())["shards"]
    compact = folder / "index.compact"
    good = compact.read_bytes()
    for damaged in (good[:100], good[:-1] + bytes([good[-1] ^ 1])):
        compact.write_bytes(damaged)
        assert main(["verify", str(folder)]) == 1
        out = capsys.readouterr().out.splitlines()
        assert out[0].startswith("BAD  ") and "index.compact" in out[0]
        assert sum(line.startswith("ok   shard-") for line in out) == len(shards) > 1
        assert out[-1] == f"{len(shards)} of {len(shards)} shards ok, 1 problem(s)"
