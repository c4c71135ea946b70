"""The jq format's renderer: ``message_construction`` pieces to one string with trained spans.

``bos_token + (piece + separator)... + eos_token``, where the pieces are the messages the jq
format made (in ``message_construction`` order). A trained piece trains its separator too (it
is how the model learns to end the piece), the EOS token is trained when the last piece is (the
model must learn to stop after an answer, not after a question), and the BOS token never is (it
is given, not predicted).
"""

from __future__ import annotations

import json

from shardtok.convert.sft.config import SFTConfig
from shardtok.convert.sft.conversation import Conversation, Rendered, merge_spans
from shardtok.errors import UsageError


class ConstructionRenderer:
    """Picklable (plain strings only), so the main process builds it once for every worker."""

    name = "jq-message-construction"

    def __init__(self, bos_token: str = "", eos_token: str = "", separator: str = "\n"):
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.separator = separator

    @property
    def source(self) -> str:
        """What decides the rendering, as text (hashed into the settings like a template)."""
        return json.dumps(
            {"bos_token": self.bos_token, "eos_token": self.eos_token, "separator": self.separator},
            sort_keys=True,
        )

    def render(self, conversation: Conversation) -> Rendered:
        parts = [self.bos_token]
        at = len(self.bos_token)
        trained, content, turns = [], [], []
        last_trained = False
        for message in conversation.messages:
            start = at
            end = start + len(message.content)
            at = end + len(self.separator)
            parts += (message.content, self.separator)
            content.append((start, end))
            turns.append((start, at, bool(message.train)))
            if message.train:
                trained.append((start, at))
            last_trained = bool(message.train)
        parts.append(self.eos_token)
        if last_trained and self.eos_token:
            trained.append((at, at + len(self.eos_token)))
        return Rendered(
            "".join(parts),
            merge_spans(trained),
            tuple(s for s in content if s[1] > s[0]),
            tuple(turns),
        )


def special_token_strings(spec) -> set[str]:
    """The special added tokens of the tokenizer `spec` (a TokenizerSpec) describes."""
    from shardtok.convert.tokenizing.tokenizer import _LOADED_BACKENDS

    backend = _LOADED_BACKENDS.get(spec.fingerprint)
    if backend is None:
        from tokenizers import Tokenizer

        backend = Tokenizer.from_str(spec.backend_json)
    return {t.content for t in backend.get_added_tokens_decoder().values() if t.special}


def jq_renderer(config: SFTConfig, spec) -> ConstructionRenderer:
    """The renderer for a jq config; its special tokens must be the tokenizer's special tokens
    (else the "<s>" of the YAML would be encoded as three ordinary tokens, silently)."""
    specials = special_token_strings(spec)
    for key in ("bos_token", "eos_token"):
        token = config.special_tokens.get(key)
        if token and token not in specials:
            known = ", ".join(sorted(specials)) or "none"
            raise UsageError(
                f"{config.source}: special_tokens {key} {token!r} is not a special token of "
                f"tokenizer {spec.name} (its special tokens: {known})"
            )
    return ConstructionRenderer(config.bos_token, config.eos_token, config.separator)
