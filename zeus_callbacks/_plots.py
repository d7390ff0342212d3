"""Every figure zeus-callbacks draws (matplotlib, imported only when a plot is asked for).

Needs the ``plot`` extra: every function that draws raises ``ImportError`` naming it
(``pip install 'zeus-callbacks[plot]'``) where matplotlib is missing. Each ``plot_*`` writes its
image through :func:`_save` (directory created, PNG unless the suffix names another format) and
returns the path written.
"""

from __future__ import annotations

import itertools
import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from zeus_callbacks._atomic_io import atomic_output
from zeus_callbacks._units import readable_interval_J, readable_joules

if TYPE_CHECKING:
    from zeus_callbacks._run_course import RunCourse
    from zeus_callbacks.store._base import TrialRecord


SIMULATED_MARK = "simulated (virtual GPU)"
"""Written on every figure drawn from virtual-GPU data, and in its PNG's ``Simulated`` text chunk."""

SIMULATED_KEY = "Simulated"
"""PNG text chunk (tEXt keyword) that holds :data:`SIMULATED_MARK` in a figure of virtual-GPU data."""

TIME_NOTE_KEY = "Time note"
"""PNG text chunk that holds a log's ``time_note`` (power-limit results on the virtual GPU: time not simulated)."""


class PowerProfile(Protocol):
    """The figures :func:`plot_power_profile` draws (a ``profile-kernel`` result has them).

    Attributes:
        name: The profiled callable's name.
        mode: ``"steady"`` or ``"isolated"``.
        energy_J: Energy per execution (J).
        energy_ci_J: Its 95 % CI (J), or None.
        executions_used: Executions behind the estimate.
        baseline_W: Idle power (W), or None.
        duration_s: Mean execution time (s).
        time_s: Bin centres from the start, shape (n_bins,) (s).
        power_W: Power profile, shape (n_bins,) (W).
        power_ci_W: Its CI band, shape (2, n_bins) (W), or None.
        simulated: The samples come from the virtual GPU.
    """

    name: str
    mode: str
    energy_J: float
    energy_ci_J: tuple[float, float] | None
    executions_used: int
    baseline_W: float | None
    duration_s: float
    time_s: Any
    power_W: Any
    power_ci_W: Any
    simulated: bool


def _pyplot() -> Any:
    """Return matplotlib's pyplot, on the Agg backend."""
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError("matplotlib is not installed (pip install 'zeus-callbacks[plot]')") from exc
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _mark_simulated(fig: Any, simulated: bool) -> None:
    """Stamp a figure drawn from virtual-GPU data (``simulated``), visibly, in its top right corner."""
    if simulated:
        fig.text(0.99, 0.99, SIMULATED_MARK, ha="right", va="top", fontsize=9, color="tab:red", fontweight="bold")


def _notes_at_bottom(fig: Any, notes: Sequence[tuple[str, str]], *, width: int, top: float = 1.0) -> None:
    """Write each ``(text, colour)`` under the axes, wrapped at ``width`` characters, the first on top.

    The axes move up to make room (``tight_layout`` below the notes and up to ``top``, a share of the
    figure's height).
    """
    line_h = 7 * 1.25 / 72 / fig.get_figheight()  # a 7 pt line, as a share of the figure's height
    y = 0.01
    for note, colour in reversed(notes):
        lines = textwrap.fill(note, width, break_on_hyphens=False)
        fig.text(0.01, y, lines, ha="left", va="bottom", fontsize=7, color=colour)
        y += line_h * (lines.count("\n") + 1)
    fig.tight_layout(rect=(0, y + 0.01, 1, top))


_LABEL_PLACES = ((4, 4, "left"), (4, -12, "left"), (-4, 4, "right"), (-4, -12, "right"))
"""Where a point's label may go, in the order tried: (x offset pt, y offset pt, alignment); right, then left."""


def _label_without_overlap(ax: Any, points: Sequence[tuple[float, float, str]], keep: set[int]) -> None:
    """Annotate points, dropping a label that would overlap one already placed (those in ``keep`` first).

    A label goes right of its point, above then below, else left of it: the first place inside the
    axes, else the first inside the figure, that overlaps no placed label. A label at the right edge
    ("125 W" of the slowest limit) so goes left instead of running off the saved image.
    """
    renderer = ax.figure.canvas.get_renderer()
    inside_axes, inside_figure = ax.get_window_extent(renderer), ax.figure.bbox
    placed: list[Any] = []
    order = sorted(range(len(points)), key=lambda i: (i not in keep, points[i][0]))
    for i in order:
        x, y, label = points[i]
        for bounds, (dx, dy, align) in itertools.product((inside_axes, inside_figure), _LABEL_PLACES):
            text = ax.annotate(label, (x, y), textcoords="offset points", xytext=(dx, dy), ha=align, fontsize=8)
            box = text.get_window_extent(renderer)
            if _contains(bounds, box) and not any(box.overlaps(other) for other in placed):
                placed.append(box)
                break
            text.remove()


def _contains(outer: Any, inner: Any) -> bool:
    """Whether bounding box ``inner`` lies within ``outer`` (display units)."""
    return bool(outer.x0 <= inner.x0 and inner.x1 <= outer.x1 and outer.y0 <= inner.y0 and inner.y1 <= outer.y1)


def _save(
    fig: Any,
    path: str | Path,
    *,
    dpi: int,
    simulated: bool,
    time_note: str | None = None,
    text: dict[str, str] | None = None,
) -> Path:
    """Write ``fig`` to ``path`` atomically, following no link planted there (docs/shared-clusters.md), and close it.

    The directory is created. The format is the file's suffix where matplotlib knows it (``.png``, ``.pdf``,
    ``.svg``, ...), else PNG. A PNG gets ``text`` as text chunks (keyword → value), then :data:`SIMULATED_KEY`
    and :data:`TIME_NOTE_KEY` where they apply, so a program can tell a simulated figure without looking at it.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        suffix = path.suffix.lower().lstrip(".")
        fmt = suffix if suffix in fig.canvas.get_supported_filetypes() else "png"
        chunks = {**(text or {}), **({SIMULATED_KEY: SIMULATED_MARK} if simulated else {})}
        if time_note:
            chunks[TIME_NOTE_KEY] = time_note
        with atomic_output(path, "wb") as fh:
            fig.savefig(fh, format=fmt, dpi=dpi, metadata=chunks if fmt == "png" else None)
    finally:
        _pyplot().close(fig)
    return path


def figure_text(fig: Any) -> list[str]:
    """Every non-empty text drawn on ``fig`` (titles, labels, legend entries, notes, marks), in drawing order."""
    from matplotlib.text import Text

    return [t.get_text() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def plot_profile(
    rows: Sequence[dict[str, float]],
    chosen_limit_W: float | None,
    path: str | Path,
    *,
    partial: bool = False,
    simulated: bool = False,
    time_note: str | None = None,
) -> Path:
    """Plot time vs energy per step of each profiled limit, the chosen one highlighted.

    Args:
        rows: The per-limit table (``limit_W``, ``energy_per_step_J``, ``time_per_step_s``); rows
            without a measurement (null or NaN) are left out.
        chosen_limit_W: The chosen limit (W), or None (observe mode, unfinished profile).
        path: The image file to write.
        partial: The profile did not finish (said in the title).
        simulated: The data come from the virtual GPU (marked, see :func:`_save`).
        time_note: Why the times are not simulated (the profile's ``time_note``), written under the axes.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 4))
    rows = [r for r in rows if _measured(r.get("time_per_step_s")) and _measured(r.get("energy_per_step_J"))]
    try:
        xs = [r["time_per_step_s"] for r in rows]
        ys = [r["energy_per_step_J"] for r in rows]
        ax.scatter(xs, ys, color="tab:blue")
        chosen = {i for i, r in enumerate(rows) if chosen_limit_W is not None and r["limit_W"] == chosen_limit_W}
        for i in chosen:
            ax.scatter([xs[i]], [ys[i]], s=160, facecolors="none", edgecolors="tab:red", label="chosen")
        ax.set_xlabel("time per step (s)")
        ax.set_ylabel("energy per step (J)")
        ax.set_title("Power-limit profile" + (" (partial: profiling did not finish)" if partial else ""))
        if chosen_limit_W is not None:
            ax.legend(loc="best")
        if time_note:  # before the labels: they are placed where the axes end up
            _notes_at_bottom(fig, [(f"TIME NOT SIMULATED: {time_note}", "tab:red")], width=90)
        else:
            fig.tight_layout()
        _label_without_overlap(ax, [(x, y, f"{r['limit_W']:.0f} W") for r, x, y in zip(rows, xs, ys, strict=True)],
                               chosen)  # fmt: skip
        _mark_simulated(fig, simulated)
    except BaseException:
        plt.close(fig)  # drawing failed; otherwise _save closes it
        raise
    return _save(fig, path, dpi=100, simulated=simulated, time_note=time_note)


def _measured(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def plot_power_profile(result: PowerProfile, path: str | Path) -> Path:
    """Save a kernel's power profile over its execution timeline, with its 95 % CI band (FinGraV).

    ``result`` comes from :func:`zeus_callbacks.measurement.kernel_profiler.profile`. A profile without
    a CI (too few executions) has no band and says so in the title; one from the virtual GPU is marked.
    """
    plt = _pyplot()
    t_ms = np.asarray(result.time_s) * 1e3
    fig, ax = plt.subplots(figsize=(7, 4))
    if result.power_ci_W is not None:
        band = np.asarray(result.power_ci_W)
        ax.fill_between(t_ms, band[0], band[1], alpha=0.3, step="mid", label="95 % CI")
    ax.step(t_ms, result.power_W, where="mid", label="power profile")
    ax.axvline(0.0, color="k", lw=0.8, ls=":")
    ax.axvline(result.duration_s * 1e3, color="k", lw=0.8, ls=":")
    if result.baseline_W is not None:
        ax.axhline(result.baseline_W, color="grey", lw=0.8, ls="--", label=f"baseline {result.baseline_W:.0f} W")
    if result.energy_ci_J is None:
        interval = "no 95 % CI (too few executions)"
    else:
        lo, hi = result.energy_ci_J
        interval = f"95 % CI {readable_interval_J(lo, hi, result.energy_J)}"
    ax.set_title(
        f"{result.name} ({result.mode})\n{readable_joules(result.energy_J)}/execution, {interval}, "
        f"{result.executions_used} execution{'' if result.executions_used == 1 else 's'}",
        fontsize=10,
    )
    ax.set_xlabel("time since execution start (ms)")
    ax.set_ylabel("power (W)")
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    _mark_simulated(fig, result.simulated)
    return _save(fig, path, dpi=110, simulated=result.simulated)


def plot_bandit_costs(trials: Sequence[TrialRecord], job_id: str, path: str | Path, *, simulated: bool = False) -> Path:
    """Plot each recurrence's cost (``trials``: the job's finished ones, in order), coloured by batch size.

    A line follows the best converged cost so far; ``simulated``: the trials ran on the virtual GPU (marked).
    """
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(7, 4))
    costs = [math.nan if t.cost is None else float(t.cost) for t in trials]
    for size in sorted({t.batch_size for t in trials}):
        points = [(i, costs[i]) for i, t in enumerate(trials) if t.batch_size == size]
        ax.scatter([p[0] for p in points], [p[1] for p in points], label=f"batch {size}", s=18)
    best, best_so_far = math.inf, []
    for t, cost in zip(trials, costs, strict=True):
        if t.converged:
            best = min(best, cost)
        best_so_far.append(best if math.isfinite(best) else math.nan)  # NaN: no point drawn yet
    ax.plot(range(len(trials)), best_so_far, color="black", lw=1, label="best converged cost")
    ax.set_xlabel("recurrence")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # recurrences are whole runs
    ax.set_ylabel("cost (ZeusCost, J-equivalent)")
    ax.set_title(f"batch-size bandit: {job_id}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    _mark_simulated(fig, simulated)
    return _save(fig, path, dpi=120, simulated=simulated)


RUN_TITLE = "{name}: power from the step reports' means (the log holds no power timeline)"
"""Title of :func:`run_figure`: the log's power figures are means over step windows, not a power trace."""


_EVAL_MARKERS = ("D", "^", "s", "v", "P", "X")
_EVAL_COLOURS = ("tab:green", "tab:purple", "tab:brown", "tab:olive", "tab:cyan", "tab:pink")


def run_figure(course: RunCourse) -> Any:
    """Draw a run's course: mean power per step report, and energy per step, over the training steps.

    Top panel: each ``steps`` record's mean power (W, summed over GPUs) across the steps it stands for, the
    warm-up steps apart, the power limit in force when each record was written (dashed), each evaluation's mean
    power (a diamond; one marker and legend entry per named evaluation dataset). Bottom panel: each record's
    mean energy per step (J). Both panels mark epoch ends (dotted), evaluations (dashed) and the power-limit
    switch (red; the profiling stretch shaded). The figure says when it is simulated and what it cannot show
    (``course.notes``), and, under the axes in red, ``TIME NOT SIMULATED:`` with ``course.time_note`` where the
    log has one.

    Returns:
        The matplotlib ``Figure`` (close it with ``matplotlib.pyplot.close``).
    """
    plt = _pyplot()
    fig, (ax_p, ax_e) = plt.subplots(2, 1, sharex=True, figsize=(11, 6.5))
    panels = ((ax_p, "power_W", "step-report mean power"), (ax_e, "energy_per_step_J", "step-report mean"))
    for ax, value, label in panels:
        for warm, colour, name in ((False, "tab:blue", label), (True, "tab:gray", "warm-up steps")):
            spans = [s for s in course.spans if s.warmup is warm and getattr(s, value) is not None]
            if spans:  # a record that stands for no step still gets a visible half-step stroke
                ends = [max(s.end_step, s.first_step + 0.5) for s in spans]
                ax.hlines([getattr(s, value) for s in spans], [s.first_step for s in spans], ends, colors=colour,
                          lw=2.5, label=name)  # fmt: skip
    if course.limits:
        ax_p.hlines([s.limit_W for s in course.limits], [s.first_step for s in course.limits],
                    [s.end_step for s in course.limits], colors="tab:red", linestyles="--", lw=1,
                    label="power limit")  # fmt: skip
    evals = [e for e in course.evals if e.power_W is not None]
    # Several named datasets evaluate at one step: each gets its own marker and legend entry, so none hides another.
    datasets = list(dict.fromkeys(e.dataset for e in evals))
    for k, dataset in enumerate(datasets):
        mine = [e for e in evals if e.dataset == dataset]
        name = "evaluation (mean power)" if dataset is None else f"evaluation {dataset} (mean power)"
        ax_p.scatter([e.step for e in mine], [e.power_W for e in mine], marker=_EVAL_MARKERS[k % len(_EVAL_MARKERS)],
                     color=_EVAL_COLOURS[k % len(_EVAL_COLOURS)], zorder=3, label=name)  # fmt: skip
    for ax in (ax_p, ax_e):
        _mark_course(ax, course, label=ax is ax_p)
    ax_p.set_ylabel("power (W, all GPUs)")
    ax_e.set_ylabel("energy per step (J)")
    ax_e.set_xlabel("training steps taken")
    ax_p.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, borderaxespad=0)
    fig.suptitle(RUN_TITLE.format(name=course.run_name or "run"), fontsize=10)
    notes = [(f"TIME NOT SIMULATED: {course.time_note}", "tab:red")] if course.time_note else []
    if course.notes:
        notes.append(("; ".join(course.notes), "black"))
    if notes:
        _notes_at_bottom(fig, notes, width=180, top=0.97)
    else:
        fig.tight_layout(rect=(0, 0.03, 1, 0.97))
    _mark_simulated(fig, course.simulated)
    return fig


def _mark_course(ax: Any, course: RunCourse, *, label: bool) -> None:
    """Epoch ends, evaluations and the power-limit switch as vertical marks (named on the top panel only)."""
    top = ax.get_xaxis_transform()  # x in steps, y in axes fraction
    for i, (epoch, step) in enumerate(course.epoch_ends):
        # above an evaluation's dashed line at the same step (drawn below), so both stay visible
        ax.axvline(step, color="0.4", ls=":", lw=1, zorder=3, label="epoch end" if label and i == 0 else None)
        if label:  # on a white ground: the power-limit line may cross the label
            ax.text(step, 0.98, f" epoch {epoch}", transform=top, fontsize=7, va="top", ha="right", color="0.3",
                    zorder=6, bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 0.5})  # fmt: skip
    for i, e in enumerate(course.evals):
        ax.axvline(e.step, color="tab:green", ls="--", lw=0.8, label="evaluation" if label and i == 0 else None)
        # a triangle at the top edge as well: an evaluation at an epoch's end step would hide behind its line
        ax.plot([e.step], [1.0], marker="v", ms=5, color="tab:green", transform=top, clip_on=False, zorder=5)
    switch = course.switch
    if switch is None:
        return
    end = max((s.end_step for s in course.spans), default=switch.step)
    if switch.trial_limits_W:
        what = "power-limit profiling" + ("" if switch.finished else " (unfinished)")
        stop = switch.step if switch.finished else end
        ax.axvspan(switch.profiling_from, stop, color="tab:orange", alpha=0.12, label=what if label else None)
        if label:
            limits = switch.trial_limits_W
            trials = (", ".join(f"{w:.0f}" for w in limits) if len(limits) <= 8
                      else f"{len(limits)} from {min(limits):.0f} to {max(limits):.0f}")  # fmt: skip
            ax.text(switch.profiling_from, 0.9, f" trial limits {trials} W", transform=top, fontsize=7,
                    color="tab:orange", va="top")  # fmt: skip
    if switch.limit_W is None:  # observe mode without a model, abandoned or unfinished profiling: nothing changed
        if label and switch.source in ("observe", "abandoned"):
            ax.text(switch.step, 0.05, f" power-limit profiling ({switch.source}): no limit chosen, none changed",
                    transform=top, fontsize=8, color="tab:red", va="bottom")  # fmt: skip
        return
    text = f" power limit → {switch.limit_W:.0f} W" if switch.applied else (
        f" observe mode: would choose {switch.limit_W:.0f} W (not applied)")  # fmt: skip
    name = "power-limit switch" if switch.applied else "profiling done (observe mode: no switch)"
    ax.axvline(switch.step, color="tab:red", lw=1.2, ls="-" if switch.applied else "-.", label=name if label else None)
    if label:
        ax.text(switch.step, 0.05, text, transform=top, fontsize=8, color="tab:red", va="bottom")


def plot_run(course: RunCourse, path: str | Path) -> Path:
    """Save :func:`run_figure` of ``course`` to ``path``; a PNG carries the figure's text in its text chunks.

    The PNG's ``Title`` is the figure's title and its ``Description`` every text on it, one per line
    (``simulated (virtual GPU)`` among them for a simulated run), so a reader or a test can check what
    it says without looking; a run with a ``time_note`` has it in the :data:`TIME_NOTE_KEY` chunk too.
    """
    fig = run_figure(course)
    text = {"Title": RUN_TITLE.format(name=course.run_name or "run"), "Description": "\n".join(figure_text(fig))}
    return _save(fig, path, dpi=110, simulated=course.simulated, time_note=course.time_note, text=text)
