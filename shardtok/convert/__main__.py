import sys

from shardtok.convert.cli import main

if __name__ == "__main__":
    sys.exit(main())
