"""``python -m bench.chaos``: see ``bench.chaos.run``."""

import sys

from bench.chaos.run import main

sys.exit(main())
