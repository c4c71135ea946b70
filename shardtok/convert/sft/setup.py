"""Everything about ``--sft`` that is decided once, in the main process, before any worker starts.

The template is loaded and checked here (a template without generation blocks, a jq pattern
that does not compile, a special token the tokenizer lacks are usage errors now, not a failure
in every worker later), and the result travels to the workers pickled in :class:`SFTSetup`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from shardtok.convert.sft.config import SFTConfig


@dataclass(frozen=True)
class SFTSetup:
    """What a conversion needs for SFT records: the settings, the renderer (``.render(
    Conversation) -> Rendered``, picklable) and the metadata recorded in the manifest."""

    config: SFTConfig
    renderer: object
    metadata: dict


def prepare_sft(config: SFTConfig, spec, tokenizer_path: str | Path) -> SFTSetup:
    """Build and check the renderer for `config` with the tokenizer `spec` (a TokenizerSpec)
    loaded from `tokenizer_path` (a folder or tokenizer.json: the ``tokenizer`` template reads
    its chat template there)."""
    if config.split_special_tokens:
        # Its probe refuses a tokenizer that cannot split: here, once, not in every worker.
        from shardtok.convert.sft.encode import SFTEncoder

        SFTEncoder(spec, max_tokens=config.max_tokens, split_special_tokens=True)

    if config.format == "jq":
        from shardtok.convert.sft.construction import jq_renderer
        from shardtok.convert.sft.jq_patterns import JqPatterns

        patterns = JqPatterns(config.loss_masking_jq_patterns, config.source)  # or UsageError
        try:
            patterns.probe()
        finally:
            patterns.close()
        renderer = jq_renderer(config, spec)
        return SFTSetup(config, renderer, config.as_metadata())
    from shardtok.convert.sft.templates import load_template, template_tokens

    renderer = load_template(
        config.template,
        tokenizer_path=str(tokenizer_path),
        train_on_input=config.train_on_input,
        train_roles=tuple(config.train_roles),
        **template_tokens(spec),
    )
    return SFTSetup(config, renderer, config.as_metadata(renderer.name, renderer.source))
