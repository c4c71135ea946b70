import sys

from shardtok.cli import main

sys.exit(main())
