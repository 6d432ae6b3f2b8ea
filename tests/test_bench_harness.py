"""The benchmark harness's rep planning (benchmarks/harness.py): how many timed runs a
contender gets before and after the time budget is spent."""
import pathlib
import sys
import types

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))
harness = pytest.importorskip("harness")


def bench(budget_spent):
    args = types.SimpleNamespace(ops=(), reps=20, min_reps=5, warmup=3, max_timing_s=1.5,
                                 time_budget=100.0)
    dev = types.SimpleNamespace(xp=np, sp=None, gpu=False)
    b = harness.Bench(args, dev, "gpu")
    if budget_spent:
        b.budget_t0 -= 2 * args.time_budget  # the budget clock is past the budget
    return b


@pytest.mark.parametrize("est_s, want", [(1.6e-4, (20, 1)), (0.5, (5, 1)), (0.1, (15, 1))])
def test_reps_within_the_budget_follow_max_timing(est_s, want):
    assert bench(False).plan(est_s) == want


@pytest.mark.parametrize("est_s, want", [
    (1.6e-4, (20, 0)),  # an SpMV keeps its reps past the budget
    (1e-3, (20, 0)),
    (5e-3, (10, 0)),    # 0.05 s of timed calls
    (0.045, (5, 0)),    # a solve: the minimum
])
def test_reps_past_the_budget_are_capped_by_time_not_cut_to_the_minimum(est_s, want):
    assert bench(True).plan(est_s) == want
