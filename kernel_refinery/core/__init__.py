"""The shared vocabulary every room uses: errors, verdicts, strategies, numerics and statistics.

It imports nothing else of kernel_refinery, so any package may import it.
"""
