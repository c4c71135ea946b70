"""A job run on a thread of its own beside a block of code, shared by the shard writer (an
fsync beside hashing) and convert (tokenizer.json written beside the first units)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def beside(name: str, job: Callable[[], object]) -> Iterator[None]:
    """Run `job` on a thread named `name` while the block runs; leaving the block waits for it
    and raises its error (unless the block's own error is on its way out)."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            job()
        except BaseException as exc:  # raised on the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()
    if errors:
        raise errors[0]
