"""The soak: experiments under injected faults, developer tooling rather than product.

    python -m benchmarks.soak --short          # one small round (the tests run it)
    python -m benchmarks.soak --minutes 30     # rounds until 30 minutes are spent

run.py drives the rounds. fake_server.py is the scripted OpenAI-compatible endpoint and
kernels.cpp the candidates' C++ (correct, wrong and faulty kernels); the tests use both too.
"""

from pathlib import Path

KERNELS_CPP = Path(__file__).with_name("kernels.cpp")
"""One source for every C++ candidate of the soak and of the CPU tests, each built as one extension."""
