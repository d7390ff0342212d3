"""Which power limit to measure next: candidates from the device's range and a search robust to curve shape.

Pure functions of what was measured: the profiler
(:class:`~zeus_callbacks.optimizers.power_limit._limit_profiler.PowerLimitProfiler`) asks
:meth:`SearchPlan.next_limit` after every decided window and measures what it returns (None:
choose now). ``unimodal``, on the grid of :func:`power_limit_grid_W`: both ends first, a
golden-section search whose comparisons respect the noise (:func:`tolerance`), shape checks (not
unimodal within the noise: a sweep; the neighbours of ties with the best), then refinement off the
grid where a local model promises more than ``refine_gain``. docs/power_limit.md ("Search") says why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

_GOLDEN = (3.0 - math.sqrt(5.0)) / 2.0  # 0.382: the golden-section fraction


def power_limit_grid_W(min_W: float, max_W: float, step_W: float = 25.0) -> list[float]:
    """Limits to profile: both ends of the device's range and evenly spaced limits between, at most ``step_W`` apart.

    The range is cut into ``ceil((max_W - min_W) / step_W)`` equal parts (limits rounded to
    1 mW), so that neither end is skipped whatever the range and ``step_W``; where ``step_W``
    divides the range this is the Zeus grid, from the maximum down in ``step_W`` steps.

    Args:
        min_W: Lowest limit the device accepts (W).
        max_W: Highest limit the device accepts (W).
        step_W: Largest spacing of the limits (W), > 0.

    Returns:
        The limits, highest first, shape (n,), W; ``[max_W]`` when the range is one point
        (under 1 mW wide).

    Raises:
        ValueError: ``step_W`` ≤ 0, a bound is not finite, or ``min_W`` > ``max_W``.

    Example:
        >>> power_limit_grid_W(100, 260, 25)
        [260.0, 237.143, 214.286, 191.429, 168.571, 145.714, 122.857, 100.0]
    """
    if not (step_W > 0 and math.isfinite(min_W) and math.isfinite(max_W)) or min_W > max_W:
        raise ValueError(f"bad grid: [{min_W}, {max_W}] W by {step_W} W")
    parts = math.ceil((max_W - min_W) / step_W - 1e-9)
    if parts <= 0 or max_W - min_W < 1e-3:  # one point, to the device's 1 mW resolution
        return [float(max_W)]
    spacing = (max_W - min_W) / parts
    inner = [round(max_W - k * spacing, 3) for k in range(1, parts)]
    return [float(max_W), *inner, float(min_W)]


@dataclass(frozen=True)
class Measured:
    """The cost of one measured limit: its mean and the half-width of its 95 % interval (same unit)."""

    cost: float
    half_width: float = 0.0
    slowdown: float | None = None  # time per step over the maximum limit's (max_slowdown only)


@dataclass(frozen=True)
class SearchSettings:
    """How the search proceeds (see the module docstring).

    Attributes:
        kind: ``unimodal`` (the search above) or ``sweep`` (every grid limit, highest first).
        noise_floor: Smallest relative cost difference taken as real (the intervals' widths
            count above it).
        refine_W: Refinement stops once the best limit's neighbours are this close (W).
        refine_probes: At most this many limits off the grid.
        refine_gain: A limit off the grid must promise at least this fraction of the best cost.
        max_slowdown: The allowed slowdown factor, for ``max_slowdown`` objectives; else None.
    """

    kind: Literal["unimodal", "sweep"] = "unimodal"
    noise_floor: float = 0.002
    refine_W: float = 5.0
    refine_probes: int = 4
    refine_gain: float = 0.005
    max_slowdown: float | None = None


def tolerance(a: Measured, b: Measured, noise_floor: float) -> float:
    """The cost difference below which ``a`` and ``b`` cannot be told apart: their intervals combined."""
    scale = noise_floor * min(abs(a.cost), abs(b.cost))
    return max(math.hypot(a.half_width, b.half_width), scale)


def is_unimodal(costs: Sequence[float], tolerance: float | Sequence[float] = 0.01) -> bool:
    """Whether ``costs`` (ordered by limit) falls to one minimum and rises after it.

    A dip smaller than ``tolerance`` × the minimum cost is noise, not a second valley; a
    sequence of tolerances gives each point its own absolute tolerance instead.
    """
    if len(costs) < 3:
        return True
    k = min(range(len(costs)), key=costs.__getitem__)
    tols = [tolerance * abs(costs[k])] * len(costs) if isinstance(tolerance, (int, float)) else list(tolerance)
    for side, side_tols in ((costs[k::-1], tols[k::-1]), (costs[k:], tols[k:])):
        running, running_tol = side[0], side_tols[0]
        for value, tol in zip(side[1:], side_tols[1:], strict=True):
            if value < running - math.hypot(tol, running_tol):  # the two points' intervals combined
                return False
            if value > running:
                running, running_tol = value, tol
    return True


class SearchPlan:
    """The search's memory between calls: whether it fell back to a sweep, how many off-grid probes it made."""

    def __init__(self, grid_W: Sequence[float], settings: SearchSettings | None = None) -> None:
        self.grid_W = sorted({float(x) for x in grid_W})  # ascending
        self.settings = settings or SearchSettings()
        self.fallback_sweep = False
        self.refine_probes = 0

    def next_limit(self, measured: Mapping[float, Measured]) -> float | None:
        """The next limit to measure, or None when the choice can be made from ``measured``."""
        grid = self.grid_W
        s = self.settings
        unmeasured_desc = [x for x in reversed(grid) if x not in measured]
        if s.kind == "sweep":
            return unmeasured_desc[0] if unmeasured_desc else None
        # max_slowdown: a lower limit is slower still, so none below a limit measured too slow is worth a sweep
        too_slow = [x for x in measured if measured[x].cost > _INFEASIBLE_AT * max(_lowest_cost(measured), 1e-30)]
        sweep_desc = [x for x in unmeasured_desc if not too_slow or x > max(too_slow)]
        if self.fallback_sweep and sweep_desc:
            return sweep_desc[0]
        for end in (grid[-1], grid[0]):
            if end not in measured:
                return end
        nxt = self._golden(measured)
        if nxt is not None:
            return nxt
        points = sorted(measured)
        # max_slowdown: the limits slower than allowed are one infeasible stretch, ordered by their
        # noisy slowdown; their order says nothing of a second valley, so the shape check leaves them out
        lowest = _lowest_cost(measured)
        feasible = [x for x in points if abs(measured[x].cost) <= _INFEASIBLE_AT * max(lowest, 1e-30)]
        costs = [measured[x].cost for x in feasible]
        tols = [max(measured[x].half_width, s.noise_floor * abs(measured[x].cost)) for x in feasible]
        if sweep_desc and not is_unimodal(costs, tols):
            self.fallback_sweep = True
            return sweep_desc[0]
        best_x = min(points, key=lambda x: (measured[x].cost, -x))
        best = measured[best_x]
        index = {x: i for i, x in enumerate(grid)}
        all_flat = all(measured[x].cost <= best.cost + tolerance(measured[x], best, s.noise_floor) for x in points)
        if all_flat and len(grid) > 2 and grid[1] not in measured:
            return grid[1]  # a valley between the minimum and a plateau level with it shows only next to the minimum
        for x in [] if all_flat else sorted(points, reverse=True):  # flat stretches next to the best can hide a dip
            if x in index and measured[x].cost <= best.cost + tolerance(measured[x], best, s.noise_floor):
                for j in (index[x] + 1, index[x] - 1):
                    if 0 <= j < len(grid) and grid[j] not in measured:
                        return grid[j]
        return self._refine(measured, best_x)

    def _golden(self, measured: Mapping[float, Measured]) -> float | None:
        grid = self.grid_W
        floor = self.settings.noise_floor
        lo, hi = 0, len(grid) - 1
        while hi - lo > 2:
            d = max(1, round(_GOLDEN * (hi - lo)))
            m1, m2 = lo + d, hi - d
            if m1 >= m2:
                m2 = m1 + 1
            for m in (m1, m2):
                if grid[m] not in measured:
                    return grid[m]
            a, b = measured[grid[m1]], measured[grid[m2]]
            if a.cost < b.cost - tolerance(a, b, floor):
                hi = m2
            elif b.cost < a.cost - tolerance(a, b, floor):
                lo = m1
            else:
                lo, hi = self._flat_bracket(measured, lo, hi, m1, m2)
        for m in range(lo, hi + 1):
            if grid[m] not in measured:
                return grid[m]
        return None

    def _flat_bracket(self, measured: Mapping[float, Measured], lo: int, hi: int, m1: int, m2: int) -> tuple[int, int]:
        """The new bracket when the probes ``m1`` < ``m2`` cannot be told apart (a flat stretch).

        A bracket end clearly below the flat level holds the valley; an end level with the
        probes means a plateau reaching that end, so the valley is on the other side; ends
        above the level put it between the probes (or everything is flat).
        """
        grid, floor = self.grid_W, self.settings.noise_floor
        a, b = measured[grid[m1]], measured[grid[m2]]
        level = a if a.cost <= b.cost else b
        left, right = measured[grid[lo]], measured[grid[hi]]
        left_low = left.cost < level.cost - tolerance(left, level, floor)
        right_low = right.cost < level.cost - tolerance(right, level, floor)
        left_flat = not left_low and left.cost <= level.cost + tolerance(left, level, floor)
        right_flat = not right_low and right.cost <= level.cost + tolerance(right, level, floor)
        if left_low and (not right_low or left.cost <= right.cost):
            return lo, m1
        if right_low:
            return m2, hi
        if right_flat and not left_flat:
            return lo, m1
        if left_flat and not right_flat:
            return m2, hi
        return m1, m2

    def _refine(self, measured: Mapping[float, Measured], best_x: float) -> float | None:
        """A limit off the grid near the best, where a local model of the cost promises a gain; None: none does."""
        s = self.settings
        if self.refine_probes >= s.refine_probes:
            return None
        points = sorted(measured)
        anchors = [best_x]
        # max_slowdown: a plateau level with the best that ends at an infeasible limit hides the
        # boundary below its lowest point (the best, by its tie-break, sits at the plateau's top)
        top = measured[best_x]
        for k in range(1, len(points)):
            x, below = points[k], measured[points[k - 1]]
            if below.cost > _INFEASIBLE_AT * max(abs(top.cost), 1e-30) >= measured[x].cost:
                if x != best_x and measured[x].cost <= top.cost + tolerance(measured[x], top, s.noise_floor):
                    anchors.append(x)
        candidates = []  # (predicted gain, limit)
        for anchor in anchors:
            candidates += self._refine_around(measured, points, points.index(anchor))
        if not candidates:
            return None
        _, x = max(candidates)
        x = round(x, 3)
        if x in measured:
            return None
        self.refine_probes += 1
        return x

    def _refine_around(
        self, measured: Mapping[float, Measured], points: Sequence[float], i: int
    ) -> list[tuple[float, float]]:
        """(predicted gain, limit) of the steps from ``points[i]`` towards its measured neighbours that promise one."""
        s = self.settings
        best_x = points[i]
        best = measured[best_x].cost
        candidates = []
        for j in (i - 1, i + 1):
            if not 0 <= j < len(points):
                continue
            other = points[j]
            boundary = measured[other].cost > _INFEASIBLE_AT * max(abs(best), 1e-30)
            # a feasibility boundary is narrowed to 1 W: the energy can fall ~1 % per W just above it
            if abs(other - best_x) <= (_BOUNDARY_W if boundary else s.refine_W):
                continue
            far = 2 * i - j  # the best's neighbour on the other side, if any
            outer = points[far] if 0 <= far < len(points) else None
            if boundary:
                # max_slowdown: the limit is on a feasibility boundary; the energy slope on the
                # feasible side bounds what halving the gap can gain
                if outer is None:
                    continue
                slope = (measured[outer].cost - best) / abs(outer - best_x)
                gain, x = max(slope, 0.0) * abs(other - best_x) / 2, 0.5 * (best_x + other)
                # the slope above a kink (a plateau's edge) understates the fall: the slowdown the
                # best leaves unused bounds it from below (energy falls at least as fast as time
                # rises where the limit binds)
                sd = measured[best_x].slowdown
                if s.max_slowdown is not None and sd is not None and sd > 0:
                    gain = max(gain, (s.max_slowdown / sd - 1.0) * abs(best))
                x = _secant_boundary(best_x, other, measured, s.max_slowdown) or x
            else:
                x, gain = _parabola_step(points, measured, i, j)
                # a kinked curve (a trace's straight pieces, a plateau's edge) beats any parabola:
                # a quarter of the smaller rise next to the best bounds what a V-shaped valley hides;
                # not beside a feasibility boundary (max_slowdown), whose rise says nothing of the valley
                rises = [measured[points[k]].cost - best for k in (i - 1, i + 1) if 0 <= k < len(points)]
                if max(rises) <= _INFEASIBLE_AT * max(abs(best), 1e-30):
                    gain = max(gain, 0.25 * min(rises))
            if gain > s.refine_gain * abs(best):
                candidates.append((gain, x))
        return candidates


@dataclass(frozen=True)
class GapPrediction:
    """What the cost curve may hold at the middle of a gap between two measured limits."""

    limit_W: float  # the gap's midpoint (W, rounded to 1 mW)
    cost: float  # predicted mean cost there (the two ends' average)
    sd: float  # predicted standard deviation (same unit as cost)


def wiener_gaps(
    measured: Mapping[float, Measured], min_gap_W: float, variance_from_W: Sequence[float] | None = None
) -> list[GapPrediction]:
    """Predict the cost at the middle of every gap between adjacent measured limits at least ``min_gap_W`` wide.

    The cost curve between measured limits is modelled as a Wiener process pinned at each of them
    (a Brownian bridge): the one-dimensional model of an unknown multi-valley curve of H. J. Kushner,
    "A new method of locating the maximum point of an arbitrary multipeak curve in the presence of
    noise", J. Basic Eng. 86(1), 1964. The caller ranks the gaps by expected improvement (J. Mockus,
    V. Tiesis, A. Žilinskas, "The application of Bayesian methods for seeking the extremum", Towards
    Global Optimisation 2, 1978). It assumes no shape: a kink between two measured limits (a trace's
    knot) or a narrow second valley is as likely as a straight line, in proportion to the gap's width.

    At a midpoint the bridge's mean is the two costs' average, whatever the curve's trend, and its
    variance ``κ² · gap / 4``, plus a quarter of each end's own variance. ``κ²`` (cost² per W) comes
    from how far each interior anchor ``b`` lies from the straight line through its neighbours ``a``
    and ``c``: for the bridge that residual has variance ``κ² · (b − a)(c − b) / (c − a)``, plus the
    three limits' noise carried through the line. So a steep but straight stretch is not read as
    roughness. ``κ²`` is the mean over the anchors of ``max(residual² − noise, 0)`` over that factor
    (a moment estimate; the clipping biases it up). A mean's noise variance is taken as
    ``(half_width / 1.96)²``, an upper bound for a Student-t half-width.

    Args:
        measured: Measured limits (W) → cost with its 95 % half-width; infeasible ones (cost above
            ``_INFEASIBLE_AT`` × the least) are left out.
        min_gap_W: Gaps narrower than this (W) are not predicted.
        variance_from_W: The anchors: limits whose residuals give ``κ²``, e.g. the search's grid (a grid
            spacing apart a residual is mostly the curve's; a watt apart it is mostly noise, which the
            half-widths of short windows understate). None, or under three of them measured: every
            measured limit.

    Returns:
        One prediction per gap wide enough, ordered by limit; empty under three feasible limits.
        Raises nothing: a non-finite cost or half-width gives a non-finite prediction, which the
        caller skips.
    """
    points = _feasible_points(measured)
    if len(points) < 3:
        return []
    var = _noise_var(measured, points)
    kappa2 = _roughness(measured, var, variance_from_W)
    out = []
    for a, b in zip(points, points[1:], strict=False):
        if b - a < min_gap_W:
            continue
        sd = math.sqrt(kappa2 * (b - a) / 4 + (var[a] + var[b]) / 4)
        out.append(GapPrediction(round(0.5 * (a + b), 3), 0.5 * (measured[a].cost + measured[b].cost), sd))
    return out


def _feasible_points(measured: Mapping[float, Measured]) -> list[float]:
    """The measured limits, sorted, but for infeasible ones (cost above ``_INFEASIBLE_AT`` × the least)."""
    lowest = _lowest_cost(measured)
    return sorted(x for x, m in measured.items() if abs(m.cost) <= _INFEASIBLE_AT * max(lowest, 1e-30))


def _noise_var(measured: Mapping[float, Measured], points: list[float]) -> dict[float, float]:
    """Each limit's noise variance, ``(half_width / 1.96)²`` (an upper bound for a Student-t half-width)."""
    return {x: (measured[x].half_width / 1.96) ** 2 for x in points}


def _roughness(
    measured: Mapping[float, Measured], var: dict[float, float], anchors_from: Sequence[float] | None
) -> float:
    """``κ²`` of :func:`wiener_gaps` (cost² per W) from the anchors among ``var``'s limits (sorted, three or more)."""
    points = list(var)
    chosen = set(anchors_from or ())
    anchors = [x for x in points if x in chosen]
    anchors = anchors if len(anchors) >= 3 else points
    terms = []
    for a, b, c in zip(anchors, anchors[1:], anchors[2:], strict=False):
        wa, wc = (c - b) / (c - a), (b - a) / (c - a)  # the line's weights at b
        residual = measured[b].cost - wa * measured[a].cost - wc * measured[c].cost
        noise = var[b] + wa * wa * var[a] + wc * wc * var[c]
        terms.append(max(residual * residual - noise, 0.0) / ((b - a) * (c - b) / (c - a)))
    return sum(terms) / len(terms)


def neighbour_pooled_costs(
    measured: Mapping[float, Measured], variance_from_W: Sequence[float] | None = None
) -> dict[float, float]:
    """Each measured limit's cost pooled with the line through its two measured neighbours.

    Choosing the least of many short, noisy readings picks the luckiest (the winner's curse): on a
    steep ``zeus_cost`` curve, a limit read from 4 steps 2 % below both neighbours was chosen at 1.5 %
    above the optimum. Under the Brownian bridge of :func:`wiener_gaps`, the line through a limit's
    neighbours ``a`` and ``c`` predicts its cost with variance ``κ² · (b − a)(c − b) / (c − a)`` plus
    the neighbours' noise carried through the line; the reading has its own noise. The pooled cost
    is their inverse-variance weighted mean (the best linear unbiased combination of two unbiased
    estimates): a reading with a narrow interval, or one far from its neighbours where the curve is
    rough, keeps its value; a straight trend is kept exactly. The two end limits, and every limit under
    three feasible ones, keep their reading.

    Args:
        measured: Measured limits (W) → cost with its 95 % half-width.
        variance_from_W: The anchors of ``κ²`` (:func:`wiener_gaps`).

    Returns:
        Limit (W) → pooled cost, for every limit of ``measured`` (infeasible ones keep their reading).
        Raises nothing: a non-finite half-width keeps the reading.
    """
    out = {x: m.cost for x, m in measured.items()}
    points = _feasible_points(measured)
    if len(points) < 3:
        return out
    var = _noise_var(measured, points)
    kappa2 = _roughness(measured, var, variance_from_W)
    for a, b, c in zip(points, points[1:], points[2:], strict=False):
        wa, wc = (c - b) / (c - a), (b - a) / (c - a)
        line = wa * measured[a].cost + wc * measured[c].cost
        line_var = kappa2 * (b - a) * (c - b) / (c - a) + wa * wa * var[a] + wc * wc * var[c]
        if not (math.isfinite(var[b]) and math.isfinite(line_var)) or var[b] <= 0 or line_var <= 0:
            continue
        out[b] = (measured[b].cost / var[b] + line / line_var) / (1 / var[b] + 1 / line_var)
    return out


_BOUNDARY_W = 1.0  # max_slowdown: the bracket of the feasibility boundary is narrowed down to this (W)
_INFEASIBLE_AT = 1e6  # a cost this many times the best's marks an infeasible limit (max_slowdown's 1e12 scale)


def _lowest_cost(measured: Mapping[float, Measured]) -> float:
    return min((abs(m.cost) for m in measured.values()), default=0.0)


def _secant_boundary(
    feasible_x: float, infeasible_x: float, measured: Mapping[float, Measured], max_slowdown: float | None
) -> float | None:
    """Where the slowdown, linear between two measured limits, reaches ``max_slowdown`` (None: unknown).

    Kept a fifth of the gap away from both limits, so that one probe narrows the bracket
    even where the time curve bends.
    """
    a, b = measured[feasible_x].slowdown, measured[infeasible_x].slowdown
    if max_slowdown is None or a is None or b is None or not a < max_slowdown < b:
        return None
    x = feasible_x + (max_slowdown - a) / (b - a) * (infeasible_x - feasible_x)
    lo, hi = sorted((feasible_x, infeasible_x))
    margin = 0.2 * (hi - lo)
    return min(max(x, lo + margin), hi - margin)


def _parabola_step(points: Sequence[float], measured: Mapping[float, Measured], i: int, j: int) -> tuple[float, float]:
    """(limit, predicted gain) of a step from the best ``points[i]`` towards its neighbour ``points[j]``.

    A parabola through the best and the nearest measured limit on each side (or the two
    nearest on one side, at an end of the measured range) gives the predicted minimum; the
    step goes to the vertex when it falls between the best and that neighbour, else to the
    golden-section point of that gap.
    """
    b, o = points[i], points[j]
    k = 2 * i - j if 0 <= 2 * i - j < len(points) else (j + (j - i) if 0 <= j + (j - i) < len(points) else None)
    golden_x = b + _GOLDEN * (o - b)
    cb, co = measured[b].cost, measured[o].cost
    if k is None:
        return golden_x, 0.0
    x1, x2, x3 = b, o, points[k]
    y1, y2, y3 = cb, co, measured[points[k]].cost
    if max(y1, y2, y3) > _INFEASIBLE_AT * max(abs(min(y1, y2, y3)), 1e-30):
        return golden_x, 0.0  # an infeasible limit (max_slowdown) in the fit: no parabola
    denom = (x1 - x2) * (x1 - x3) * (x2 - x3)
    a = (x3 * (y2 - y1) + x2 * (y1 - y3) + x1 * (y3 - y2)) / denom
    if a <= 0:  # not convex here: no vertex to trust; a golden step, gain bounded by the gap's rise
        return golden_x, 0.0
    bb = (x3 * x3 * (y1 - y2) + x2 * x2 * (y3 - y1) + x1 * x1 * (y2 - y3)) / denom
    vertex = -bb / (2 * a)
    lo_x, hi_x = min(b, o), max(b, o)
    if not lo_x < vertex < hi_x:
        return golden_x, 0.0
    c = y1 - a * x1 * x1 - bb * x1
    predicted = a * vertex * vertex + bb * vertex + c
    # keep the probe off the two ends of the gap: a probe next to a measured limit teaches little
    margin = 0.15 * (hi_x - lo_x)
    return min(max(vertex, lo_x + margin), hi_x - margin), cb - predicted


__all__ = [
    "GapPrediction",
    "Measured",
    "SearchPlan",
    "SearchSettings",
    "is_unimodal",
    "power_limit_grid_W",
    "tolerance",
    "wiener_gaps",
]
