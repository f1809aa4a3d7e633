"""``python -m bench.lifecycle``: see ``bench.lifecycle.run``."""

import sys

from bench.lifecycle.run import main

sys.exit(main())
