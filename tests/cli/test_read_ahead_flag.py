"""--read-ahead-mb sets the memory cap of remote streams (RetryPolicy.read_ahead_bytes), which
every command already hands to its sources with --max-attempts and --timeout."""

from __future__ import annotations

import pytest

from shardtok.cli.main import build_parser, main
from shardtok.cli.storage_args import retry_policy
from shardtok.storage import RetryPolicy


def test_the_switch_becomes_the_policy_cap():
    parser = build_parser()
    args = parser.parse_args(["--read-ahead-mb", "8", "inspect", "s3://b/ds"])
    assert retry_policy(args) == RetryPolicy(read_ahead_bytes=8 << 20)
    args = parser.parse_args(["inspect", "s3://b/ds", "--read-ahead-mb", "0.5", "--timeout", "5"])
    assert retry_policy(args) == RetryPolicy(timeout=5, read_ahead_bytes=512 << 10)
    assert retry_policy(parser.parse_args(["inspect", "s3://b/ds"])) is None  # defaults


@pytest.mark.parametrize("value", ["0.01", "nan", "lots"])
def test_a_cap_too_small_or_not_a_number_is_refused_in_one_line(capsys, value):
    with pytest.raises(SystemExit) as info:
        main(["inspect", "s3://b/ds", "--read-ahead-mb", value])
    assert info.value.code == 2
    assert "--read-ahead-mb" in capsys.readouterr().err


def test_the_library_refuses_a_cap_below_64_kib():
    with pytest.raises(ValueError, match="read_ahead_bytes must be >= 65536"):
        RetryPolicy(read_ahead_bytes=1000)
