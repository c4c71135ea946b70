"""An unrecognized option is refused by the command it was given to, naming the option meant."""

from __future__ import annotations

import pytest

from shardtok.cli.main import main


def refusal(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_status:
        main(argv)
    assert exit_status.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err.strip()


def test_a_misspelt_option_names_the_one_meant(capsys):
    err = refusal(["stream", "data", "--batchsize", "8"], capsys)
    assert err == (
        "shardtok stream: error: unrecognized arguments: --batchsize 8 (did you mean "
        "--batch-size?) (see shardtok stream --help)"
    )
    # underscores, as the Python API spells the options; with a value after "="
    err = refusal(["trace", "data", "--step", "1", "--seq_len=8", "--num_workers", "2"], capsys)
    assert "(did you mean --seq-len for --seq_len, --num-workers for --num_workers?)" in err
    assert err.startswith("shardtok trace: error: unrecognized arguments: --seq_len=8")
    assert "did you mean --json?" in refusal(["inspect", "data", "--jsn"], capsys)


def test_nothing_close_is_suggested_for_nothing_close(capsys):
    err = refusal(["stream", "data", "--frobnicate"], capsys)
    assert err == (
        "shardtok stream: error: unrecognized arguments: --frobnicate (see shardtok stream --help)"
    )
    assert "did you mean" not in refusal(["stream", "data", "--seed", "1", "-3"], capsys)


def test_an_unambiguous_prefix_is_still_taken(capsys):
    from shardtok.cli.main import build_parser

    args = build_parser().parse_args(["stream", "data", "--batch", "8"])
    assert args.batch_size == 8
