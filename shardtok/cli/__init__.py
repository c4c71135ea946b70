"""The `shardtok` command line (``shardtok.cli.main.main``); see ``shardtok --help``."""

import sys
import types


def main(argv: list[str] | None = None) -> int:
    """The `shardtok` command (``shardtok.cli.main.main``), with Ctrl-C during its imports
    reported like any other interruption: one line and exit 130, never a traceback."""
    # Importing the commands and their layers (numpy, tokenizers...) takes a few tenths of a
    # second after start: the window a prompt Ctrl-C lands in. Only this module, the
    # `shardtok` package and the interpreter's own start-up stay outside it.
    try:
        from shardtok.cli.main import main as command
    except KeyboardInterrupt:
        print("shardtok: interrupted", file=sys.stderr)
        return 130
    return command(argv)


class _Package(types.ModuleType):
    # The import system binds a submodule on its package once loaded, whoever imports it first:
    # `shardtok.cli.main` (the module) would replace this `main`, and `from shardtok.cli import
    # main` would give a module. The name stays the command, as it always was here.
    def __setattr__(self, name, value):
        if name == "main" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

__all__ = ["main"]
