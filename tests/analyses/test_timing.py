"""The one timer and the one quadratic fit (lib.timing), on calls and curves with
known answers."""

from __future__ import annotations

import ast
import doctest
import math
from pathlib import Path

import pytest

from headscope.errors import HeadscopeError
from lib import timing
from lib.timing import best_time, fit_quadratic


def test_docstring_examples():
    result = doctest.testmod(timing, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_timing_is_a_leaf_module():
    """Benchmarks import it without the rest of headscope: nothing but headscope.errors."""
    tree = ast.parse(Path(timing.__file__).read_text())
    imported = {
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    }
    imported |= {
        a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names
    }
    assert {m for m in imported if m.startswith("headscope")} == {"headscope.errors"}


# ------------------------------------------------------------------------ best_time


class _Clock:
    """A fake ``time.perf_counter``: each call of the timed function lasts the next listed
    duration."""

    def __init__(self, durations):
        self.now, self.durations, self.calls = 0.0, list(durations), 0

    def perf_counter(self):
        return self.now

    def fn(self):
        self.now += self.durations[self.calls]
        self.calls += 1


@pytest.fixture
def clock(monkeypatch):
    def make(durations):
        c = _Clock(durations)
        monkeypatch.setattr(timing.time, "perf_counter", c.perf_counter)
        return c

    return make


def test_best_time_returns_the_fastest_of_every_repeat(clock):
    c = clock([3.0, 1.0, 2.0])
    assert best_time(c.fn, repeats=3) == 1.0
    assert c.calls == 3


def test_best_time_budget_stops_repeating(clock):
    c = clock([4.0, 7.0, 1.0])
    assert best_time(c.fn, repeats=3, budget_s=10.0) == 4.0  # 4 + 7 >= 10: no third call
    assert c.calls == 2
    c = clock([0.5, 0.5, 0.5])
    assert best_time(c.fn, repeats=3, budget_s=0.0) == 0.5  # budget spent after one call
    assert c.calls == 1


def test_best_time_long_run_is_measured_once(clock):
    """The benchmark's rule: best of 3 when a run takes under 10 s, one run otherwise."""
    c = clock([12.0, 1.0, 1.0])
    assert best_time(c.fn, repeats=3, long_s=10.0) == 12.0
    assert c.calls == 1
    c = clock([9.0, 8.0, 9.5])
    assert best_time(c.fn, repeats=3, long_s=10.0) == 8.0
    assert c.calls == 3


def test_best_time_needs_a_repeat():
    with pytest.raises(HeadscopeError, match="repeats >= 1"):
        best_time(lambda: None, repeats=0)


# ------------------------------------------------------------------------ fit_quadratic


def test_fit_quadratic_recovers_coefficients():
    n = [100, 200, 400, 800, 1600]
    fit = fit_quadratic(n, [0.5 + 1e-3 * x + 2e-6 * x * x for x in n])
    assert (
        fit["a"] == pytest.approx(0.5)
        and fit["b"] == pytest.approx(1e-3)
        and fit["c"] == pytest.approx(2e-6)
    )
    assert fit["n_cross"] == pytest.approx(500)  # b / c


def test_fit_quadratic_never_negative():
    n = [100, 200, 400, 800]
    fit = fit_quadratic(n, [1.0 - 1e-4 * x + 1e-6 * x * x for x in n])  # a falling linear part
    assert min(fit["a"], fit["b"], fit["c"]) >= 0 and fit["b"] == 0 and fit["c"] > 0
    fit = fit_quadratic(n, [0.01 * x for x in n])  # purely linear
    assert fit["c"] == 0 and fit["n_cross"] == math.inf and fit["b"] == pytest.approx(0.01)


def test_fit_quadratic_weighs_short_runs_like_long_ones():
    """Relative error: a 1% miss on a 0.01 s run costs as much as a 1% miss on a 100 s run."""
    n = [10, 100, 1000, 10_000]
    t = [1e-3 * x + 1e-6 * x * x for x in n]
    t[0] *= 1.5  # one noisy short run
    fit = fit_quadratic(n, t)
    assert fit["c"] == pytest.approx(1e-6, rel=0.05)  # the long runs still pin c
    predicted_short = fit["a"] + fit["b"] * 10 + fit["c"] * 100
    # and the short run is not ignored (plain least squares: 0.85)
    assert predicted_short / t[0] > 0.95


def test_fit_quadratic_from_two_points():
    fit = fit_quadratic([100, 200], [1.0, 3.0])
    assert fit["a"] + fit["b"] * 100 + fit["c"] * 100**2 == pytest.approx(1.0)
    assert fit["a"] + fit["b"] * 200 + fit["c"] * 200**2 == pytest.approx(3.0)
    assert min(fit["a"], fit["b"], fit["c"]) >= 0


@pytest.mark.parametrize(
    "n, seconds, match",
    [
        ([1, 2], [1.0], "as many times as lengths"),
        ([], [], "at least one"),
        ([1, 2], [1.0, 0.0], "positive, finite times"),
        ([1, 2], [1.0, math.nan], "positive, finite times"),
    ],
)
def test_fit_quadratic_refuses_bad_input(n, seconds, match):
    with pytest.raises(HeadscopeError, match=match):
        fit_quadratic(n, seconds)
