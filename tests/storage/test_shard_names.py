"""Shard lists, brace patterns and globs: WebDataset's expansion, and what names one dataset."""

from __future__ import annotations

import random
import re

import pytest

from shardtok.dataset.shard_names import (
    MIX_HINT,
    ShardSelection,
    check_not_manifest,
    expand_braces,
    expand_urls,
    select_shards,
)
from shardtok.errors import UsageError

CASES = [
    "shard-{000000..000011}.tar",
    "python{2.{5..7},3.{2,3}}",
    "{07..10}{a..c}",
    "{a..g..2}",
    "{4..1}",
    "{2..-1}",
    "{-05..5..3}",
    "index.html{,.backup}",
    "{abc}",
    "{a{1,2}}",
    "{{a,b},c}",
    "{}",
    "{,}",
    "a}{b",
    "{z..A}",
    "{1..2..0}",
    r"{1\,2,3}",
    r"{a\\\\b,c}",
    "a\\",
]


def test_expansion_is_braceexpands():
    braceexpand = pytest.importorskip("braceexpand")
    for pattern in CASES:
        assert expand_braces(pattern) == list(braceexpand.braceexpand(pattern)), pattern
    # Random strings over the characters that matter, corner cases included: the same names,
    # or both refuse the braces as unbalanced.
    rng = random.Random(17)
    alphabet = [*"ab{},.\\0129-z", ".."]
    for _ in range(3000):
        pattern = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        try:
            want = list(braceexpand.braceexpand(pattern))
        except braceexpand.UnbalancedBracesError:
            with pytest.raises(UsageError, match="unbalanced braces"):
                expand_braces(pattern)
            continue
        assert expand_braces(pattern) == want, pattern


def test_double_colon_joins_patterns_as_in_webdataset():
    shardlists = pytest.importorskip("webdataset.shardlists")
    text = "a/shard-{000000..000002}.tar::b/x-{1,3}.tar"
    assert expand_urls(text) == shardlists.expand_urls(text)
    assert len(expand_urls(text)) == 5
    # An IPv6 host's "::" joins nothing.
    assert expand_urls("http://[::1]:8080/d/s-{0..1}.tar") == [
        "http://[::1]:8080/d/s-0.tar",
        "http://[::1]:8080/d/s-1.tar",
    ]


def test_a_huge_pattern_is_refused_before_any_name_is_made():
    with pytest.raises(UsageError, match="expands to 10,000,000,000 names, more than 1,000,000"):
        expand_braces("s-{0..99999}-{0..99999}.tar")
    with pytest.raises(UsageError, match="more than 1,000,000"):
        expand_urls("a-{0..600000}.tar::b-{0..600000}.tar")
    assert len(expand_braces("s-{0..9}{0..9}.tar", limit=100)) == 100
    with pytest.raises(UsageError, match="unbalanced braces"):
        expand_braces("shard-{000000..000003.tar")


def test_bounds_past_any_machine_integer_are_a_usage_error():
    pattern = "data/shard-{0..99999999999999999999999}.tar"
    with pytest.raises(UsageError) as info:
        select_shards(pattern)
    assert str(info.value) == (
        f"pattern {pattern!r} expands to 100,000,000,000,000,000,000,000 names, more than "
        "1,000,000: name fewer shards per pattern"
    )
    with pytest.raises(UsageError, match=r"a range's number has more than 30 digits"):
        expand_braces("s-{0..1%s}.tar" % ("0" * 5000))  # past what int() reads from text
    with pytest.raises(UsageError, match=r"more than 30 digits"):
        expand_braces("s-{a..c..%s}.tar" % ("9" * 5000))
    with pytest.raises(UsageError, match=r"expands to over 10\^30 names, more than 1,000,000"):
        expand_braces("x" + "{0..999999999999}" * 3000)  # a count of 36,000 digits
    assert expand_braces("s-{1..3..99999999999999999999}") == ["s-1"]


def test_what_names_a_dataset_or_some_of_its_shards(tmp_path):
    data = tmp_path / "ds"
    data.mkdir()
    for i in (0, 1, 2, 10):
        (data / f"shard-{i:06d}.tar").write_bytes(b"")
    (data / "index.json").write_bytes(b"{}")
    assert select_shards(str(data)) == ShardSelection(str(data))
    assert select_shards("s3://bucket/ds") == ShardSelection("s3://bucket/ds")
    brace = select_shards(f"{data}/shard-{{000001..000002}}.tar")
    assert brace == ShardSelection(str(data), ("shard-000001.tar", "shard-000002.tar"))
    glob = select_shards(f"{data}/shard-00000?.tar")  # sorted, as a shell would
    assert glob.shards == ("shard-000000.tar", "shard-000001.tar", "shard-000002.tar")
    listed = select_shards([data / "shard-000010.tar", f"{data}/shard-{{000000,000002}}.tar"])
    assert listed.shards == ("shard-000010.tar", "shard-000000.tar", "shard-000002.tar")
    one = select_shards(f"{data}/shard-000001.tar")
    assert one == ShardSelection(str(data), ("shard-000001.tar",))
    remote = select_shards("https://host/ds/shard-{000000..000001}.tar::https://host/ds/x.tar")
    assert remote == ShardSelection("https://host/ds", ("shard-000000.tar", "shard-000001.tar",
                                                        "x.tar"))  # fmt: skip
    relative = select_shards("ds/shard-00000[01].tar", base=tmp_path)  # a config's folder
    assert relative == ShardSelection(str(data), ("shard-000000.tar", "shard-000001.tar"))


def test_anything_but_shards_of_one_dataset_is_refused(tmp_path):
    data = tmp_path / "ds"
    other = tmp_path / "other"
    data.mkdir()
    other.mkdir()
    refusals = {
        # shards of two datasets, or a dataset folder in a list: a mix, named otherwise
        f"{data}/shard-000000.tar::{other}/shard-000000.tar": MIX_HINT,
        "s3://a/ds/shard-{0,1}.tar::s3://b/ds/shard-2.tar": MIX_HINT,
        "https://h1/ds/s.tar::https://h2/ds/t.tar": MIX_HINT,
        f"{data}/{{index.json,shard-0.tar}}": "not a shard file name",
        f"{data}/shard-{{0,0}}.tar": "named twice",
        f"{data}/nothing-*.tar": "matches no file",
        "https://host/ds/shard-*.tar": "globs are for local paths only",
        "s3://bucket/ds/shard-[01].tar": "globs are for local paths only",
        "https://host/ds/shard-0.tar?X-Amz-Signature=secret": "query or fragment",
        f"{data}/shard-{{0..2000000}}.tar": "more than 1,000,000",
    }
    for given, message in refusals.items():
        with pytest.raises(UsageError, match=message) as caught:
            select_shards(given)
        assert "secret" not in str(caught.value) and "\n" not in str(caught.value)
    # A dataset is named by its folder: its index.json, or any other file, is a one-line error.
    (data / "index.json").write_bytes(b"{}")
    (data / "c.jsonl").write_bytes(b"")
    for given, message in {
        f"{data}/index.json": f"name the dataset by its folder or URL prefix, '{data}'",
        "https://host/ds/index.json": "name the dataset by its folder or URL prefix, 'https://host/ds'",
        f"{data}/c.jsonl": "is a file, not a dataset folder",
    }.items():
        with pytest.raises(UsageError, match=re.escape(message)):
            select_shards(given)
    with pytest.raises(UsageError, match=MIX_HINT):
        select_shards([str(data), str(other)])
    with pytest.raises(UsageError, match="empty list"):
        select_shards([])


def test_either_manifest_given_for_its_dataset_names_the_folder(tmp_path):
    # index.compact is the dataset's too: read as a lone shard it was "tar header checksum
    # field ... is not octal", read as a remote prefix "no dataset manifest here".
    (tmp_path / "index.compact").write_bytes(b"STKCMAN\0")
    for given, folder in {
        f"{tmp_path}/index.compact": str(tmp_path),
        "s3://bucket/ds/index.compact": "s3://bucket/ds",
    }.items():
        with pytest.raises(
            UsageError,
            match=re.escape(
                f"index.compact: name the dataset by its folder or URL prefix, '{folder}'"
            ),
        ):
            check_not_manifest(given)
        with pytest.raises(UsageError, match="is the dataset's index.compact"):
            select_shards(given)
