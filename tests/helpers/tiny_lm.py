"""A tiny random Llama causal LM on CPU: checks labels against a real model's own loss."""

from __future__ import annotations


def tiny_causal_lm(vocab_size: int, *, layers: int = 1, attn_implementation: str | None = None):
    """A stock config (``use_cache`` as shipped), `layers` deep; `attn_implementation` None
    leaves transformers' default."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    if attn_implementation is not None:
        config._attn_implementation = attn_implementation
    return transformers.LlamaForCausalLM(config).eval()
