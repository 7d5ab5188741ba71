"""python -m benchmarks.soak: see benchmarks/soak/run.py."""

import sys

from benchmarks.soak.run import main

if __name__ == "__main__":
    sys.exit(main())
