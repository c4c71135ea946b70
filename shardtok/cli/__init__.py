"""The `shardtok` command line (``shardtok.cli.main.main``); see ``shardtok --help``."""

from shardtok.cli.main import main

__all__ = ["main"]
