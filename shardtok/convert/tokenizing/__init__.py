"""Text to token ids: the tokenizer of a job, the tiktoken fast path and the gate and canary
that keep it exact."""
