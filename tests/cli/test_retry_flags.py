"""--max-attempts and --timeout reach the reads of inspect, verify, stream and trace, and
ShardStreamDataset(retry=...) those of every source: nginx answers 503 under /unavailable/, so
each read is retried until the budget given runs out, with one warning per retry."""

from __future__ import annotations

import re

import pytest

from shardtok.cli.main import main
from shardtok.storage import RetryPolicy
from tests.helpers.servers import http_server  # noqa: F401

COMMANDS = [
    ["inspect", "{url}"],
    ["verify", "{url}"],
    ["stream", "{url}", "--seq-len", "8", "--batch-size", "1"],
    ["trace", "{url}", "--seq-len", "8", "--batch-size", "1", "--step", "1"],
]


@pytest.mark.parametrize("words", COMMANDS, ids=lambda w: w[0])
def test_the_budget_given_is_the_budget_spent(http_server, capsys, words):  # noqa: F811
    url = http_server.url("unavailable/ds")
    argv = [w.format(url=url) for w in words]
    assert main(["--max-attempts", "2", *argv, "--timeout", "5"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2, err  # one retry, then the error
    assert err[0].startswith("warning: ") and "attempt 1/2 failed" in err[0]
    # the dataset's first file: index.compact when it looks for one, index.json for verify
    assert re.search(r"ds/index\.(compact|json): gave up after 2 attempts", err[1]), err[1]
    assert main([*argv, "--max-attempts", "1", "-qq"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gave up after 1 attempts" in err[0], err


def test_the_dataset_takes_a_retry_policy(http_server, caplog):  # noqa: F811
    from shardtok.errors import StorageError
    from shardtok.torch import ShardStreamDataset

    url = http_server.url("unavailable/ds")
    policy = RetryPolicy(max_attempts=3, initial_delay=0.01)
    with pytest.raises(StorageError, match="gave up after 3 attempts"):
        ShardStreamDataset(url, retry=policy, seq_len=8, batch_size=1)
    with pytest.raises(StorageError, match="gave up after 3 attempts"):
        ShardStreamDataset(
            {url: 1.0, url + "2": 1.0}, retry=policy, seq_len=8, batch_size=1, num_batches=1
        )
    assert sum("attempt" in r.getMessage() for r in caplog.records) == 4
