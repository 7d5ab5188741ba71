"""python -m benchmarks.soak: see benchmarks/soak/run.py."""

import sys

from benchmarks.soak.run import main

sys.exit(main())
