"""An optional second opinion for the static step: kernelguard, GPU MODE's rule-based reward-hack detector.

    pip install 'kernel-refinery[kernelguard]'

kernelguard_findings(source) runs kernelguard's rules on a candidate's text under its built-in
`sol-execbench` profile, whose entry points include `forward` (the `default` profile looks only at
GPU MODE's `custom_kernel` and so never sees ModelNew.forward). It returns one message per rule that
made kernelguard classify the source `hacked`; rules it rates lower (suspicious, low confidence)
are left out. benchmarks/kernelguard_eval.py measures it beside kernel_refinery.tools.guards.static_check: on the tests'
hack candidates it adds POINTER_REPLAY (an output memo keyed by data_ptr()) and
OUTPUT_REPLAY_CACHE (a `_CACHE` of outputs), and it flagged none of the honest kernels. Its rules
go by names and shapes of code: a renamed cache passes, and an honest dict of kernels named
`_CACHE` read in forward is called a hack.

kernelguard runs in a child process under a time limit. Several of its regular expressions take
time quadratic in the length of a run of word characters (a valid `<16,000-letter name> = 1` took
9 to 15 s here), so in-process a hostile candidate could stall the evaluator. A source it cannot judge
in time, or that makes it fail, gets a finding that says so (fail closed). The child reads the
source as text and never imports or runs it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.util import find_spec

PROFILE = "sol-execbench"
TIMEOUT_S = 10.0
NOT_INSTALLED = 3
"""The child's exit status when it cannot import kernelguard."""

_CHILD = """
import json, sys
try:
    import kernelguard
except ImportError:
    sys.exit(3)
kernelguard.configure_runtime(profile=sys.argv[1])
sys.stdin.reconfigure(encoding="utf-8", errors="surrogatepass")
found = kernelguard.analyze_code(sys.stdin.read(), compute_structural_hash=False)
hard = [
    m for m in found["matched_patterns"]
    if found["should_filter"] and kernelguard.get_rule_policy(m["pattern"]).max_outcome == kernelguard.AUTO_FILTER
]
json.dump([[m["pattern"], str(m.get("evidence", ""))] for m in hard], sys.stdout)
"""


def kernelguard_findings(source: str, *, timeout: float = TIMEOUT_S) -> tuple[str, ...] | None:
    """kernelguard's reasons to reject the candidate (empty when it has none); None when kernelguard is not installed."""
    if find_spec("kernelguard") is None:
        return None
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-c", _CHILD, PROFILE],
            input=source,
            capture_output=True,
            encoding="utf-8",
            errors="surrogatepass",
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return (
            f"kernelguard did not finish within {timeout:g} s: its rules take time quadratic in the longest run of "
            "letters, digits and underscores; keep names and string literals short (no long hex or base64 blobs)",
        )
    if done.returncode == NOT_INSTALLED:
        return None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        return (f"kernelguard failed on this source (exit status {done.returncode}: {last[:200]}); send plain, short Python",)
    return tuple(f"kernelguard {pattern}: {evidence}" for pattern, evidence in json.loads(done.stdout))
