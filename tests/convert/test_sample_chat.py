"""The chat sample corpus: openai-format records built from stdlib docstrings."""

import json

from shardtok.convert.inputs.sample_corpus import iter_chat_records, write_sample_corpus


def test_chat_records_are_well_formed_conversations(tmp_path):
    records, nbytes = write_sample_corpus(tmp_path / "chat.jsonl", 200_000, chat=True)
    lines = (tmp_path / "chat.jsonl").read_bytes().splitlines()
    assert records == len(lines) > 10 and 0 < nbytes <= 200_000
    roles_seen = set()
    for line in lines:
        messages = json.loads(line)["messages"]
        roles = [m["role"] for m in messages]
        roles_seen.update(roles)
        body = roles[1:] if roles[0] == "system" else roles
        # user/assistant alternate, the assistant always answers last
        assert body == ["user", "assistant"] * (len(body) // 2) and len(body) in (2, 4)
        assert all(isinstance(m["content"], str) and m["content"].strip() for m in messages)
    assert roles_seen == {"system", "user", "assistant"}


def test_chat_records_are_deterministic():
    first = [r for _, r in zip(range(50), iter_chat_records())]
    again = [r for _, r in zip(range(50), iter_chat_records())]
    assert first == again
    assert any(len(r["messages"]) >= 4 for r in first)  # follow-up turns exist
