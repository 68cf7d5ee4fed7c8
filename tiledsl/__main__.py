"""`python -m tiledsl`: the same as the `tiledsl` command."""
import sys

from tiledsl.cli import main

sys.exit(main())
