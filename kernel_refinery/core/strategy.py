"""The search strategies a run can use; part of every trajectory's identity (TrajectoryId.strategy)."""

from __future__ import annotations

from enum import StrEnum


class Strategy(StrEnum):
    """How turns are scheduled (agent/strategies.py). The values are what configs, results and
    trace names have always spelled."""

    REFINE = "refine"
    """One trajectory of sequential refinement, each turn seeing the last one's feedback."""
    BEST_OF_N = "best-of-n"
    """n independent refinement trajectories; the best kernel of any wins."""
    BEAM = "beam"
    """Rounds of idea proposal and expansion, keeping the best kernels as seeds."""
