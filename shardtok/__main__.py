import sys

from shardtok.command import main

sys.exit(main())
