"""A fast screen of our power-limit search alone: job-total regret per case, seed and job length N.

``power_limit_families.py`` runs the Zeus sweep and the shrunk sweeps beside every case, which is
most of its time (an hour on two cores). A change to the search does not change the sweeps, so
this script runs our search only, told N (``power_limit_families.run_search``), and writes one JSON
line per run: the case, the seed, N, the job-total regret (%, profiling included, on the true
curve), the chosen limit and its gap (%), and the profiled steps. With ``--against`` it reads the
sweep's regret of each case from a families runs file (``--runs-out``) and prints, per N, our mean
and worst regret and how many runs fail a target of issue 31 (regret above the sweep's; above half
the sweep's at N <= 10 000; above 1 % at N >= 10 000), next to a previous screen's (``--before``).

    PYTHONPATH=. python benchmarks/power_limit_regret_screen.py --objectives energy --families non_unimodal \
        --n 10000,50000 --seeds 0,1 --out after.jsonl \
        --against docs/results/families_2026-12-07c/all_energy_zeus_cost_runs.jsonl --before before.jsonl
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import statistics
import sys
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's package, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmarks

Key = tuple[str, str, str, float]  # objective, family, label, grid step (W)


@contextlib.contextmanager
def _variant_applied(changes: dict[str, float]) -> Iterator[None]:
    """Screen a variant without editing the package, for the runs inside the block only (then undone).

    Each name is a ``ProfileSettings`` field (every profiler built inside gets it) or an upper-case
    constant of the profiler's module (``_SCOUT_BUDGET_SHARE``).

    Raises:
        SystemExit: A name is neither.
    """
    import dataclasses

    from zeus_callbacks.optimizers.power_limit import _limit_profiler as profiler

    fields = {f.name for f in dataclasses.fields(profiler.ProfileSettings)}
    for name in changes:
        if name not in fields and not (name.lstrip("_").isupper() and hasattr(profiler, name)):
            raise SystemExit(f"--variant {name}: neither a ProfileSettings field nor a constant of the profiler")
    saved = {name: getattr(profiler, name) for name in changes if name not in fields}
    settings = {name: value for name, value in changes.items() if name in fields}
    init = profiler.PowerLimitProfiler.__init__

    def screened(self, limits_W, objective, energy_fn, settings_=None, **kwargs):  # type: ignore[no-untyped-def]
        init(self, limits_W, objective, energy_fn, dataclasses.replace(settings_ or profiler.ProfileSettings(),
                                                                       **settings), **kwargs)  # fmt: skip

    try:
        for name, value in saved.items():
            setattr(profiler, name, type(value)(changes[name]))
        if settings:
            profiler.PowerLimitProfiler.__init__ = screened  # type: ignore[method-assign]
        yield
    finally:
        profiler.PowerLimitProfiler.__init__ = init  # type: ignore[method-assign]
        for name, value in saved.items():
            setattr(profiler, name, value)


def _one(job: tuple[Key, int, int, dict[str, float]]) -> dict:
    """One case, seed and N: our search told N, its job-total regret (%)."""
    key, seed, n, changes = job
    import power_limit_families as families

    case = next(c for c in families.cases([]) if (c.objective, c.family, c.label, c.step_W) == key)
    package_logger = logging.getLogger("zeus_callbacks")
    level = package_logger.level
    package_logger.setLevel(logging.ERROR)  # the sessions' sampling notices, once per run; restored (tests call this)
    try:
        with _variant_applied(changes):
            decided = families.run_search(case, seed, {"job_steps": n})
    finally:
        package_logger.setLevel(level)
    best = families.best_cost(case.curve, case.objective)
    cost_at = {x: families.step_cost(case.curve, case.objective, x) for x in {decided.limit_W, *decided.step_limits_W}}
    regret = families.job_regret([cost_at[x] for x in decided.step_limits_W], cost_at[decided.limit_W], best, n)
    return {"case": list(key), "seed": seed, "n": n, "regret": 100 * regret, "limit_W": decided.limit_W,
            "gap_pct": 100 * (cost_at[decided.limit_W] / best - 1), "steps": decided.steps, "set": changes}  # fmt: skip


def _sweep_regrets(runs_file: Path) -> dict[tuple[Key, int], float]:
    """(case, N) → the full sweep's regret (%) from a families runs file."""
    out = {}
    for line in runs_file.open():
        row = json.loads(line)
        if row["mode"] != "sweep":
            continue
        label, step = row["case"].rsplit(" step ", 1)
        for n, regret in row["regret"].items():
            out[((row["objective"], row["family"], label, float(step)), int(n))] = 100 * regret
    return out


def _fails(regret: float, sweep: float, n: int) -> bool:
    """Whether a run fails a target of issue 31."""
    return regret > sweep or (n <= 10_000 and regret > 0.5 * sweep) or (n >= 10_000 and regret > 1.0)


def _summary(rows: list[dict], sweep: dict[tuple[Key, int], float]) -> dict[int, dict]:
    """Per N: runs, mean and worst regret (%), runs failing a target, and cases whose mean over the seeds fails one."""
    out = {}
    for n in sorted({r["n"] for r in rows}):
        at = [r for r in rows if r["n"] == n and (tuple(r["case"]), n) in sweep]
        by_case: dict[Key, list[float]] = {}
        for r in at:
            by_case.setdefault(tuple(r["case"]), []).append(r["regret"])  # type: ignore[arg-type]
        regrets = [r["regret"] for r in at]
        out[n] = {
            "runs": len(at),
            "mean": round(statistics.mean(regrets), 4) if at else None,
            "max": round(max(regrets), 4) if at else None,
            "fails": sum(_fails(r["regret"], sweep[(tuple(r["case"]), n)], n) for r in at),
            "cases": len(by_case),
            "mean_fails": sum(_fails(statistics.mean(v), sweep[(k, n)], n) for k, v in by_case.items()),
        }
    return out


def _variant(text: str) -> tuple[str, dict[str, float]]:
    """``NAME:K=V,K=V`` (or ``NAME`` alone: the tree as it is) → (NAME, {K: V})."""
    name, _, spec = text.partition(":")
    return name, {k: float(v) for k, v in (kv.split("=", 1) for kv in spec.split(",") if kv)}


def main() -> None:
    """Run the screen, write its rows, print the summary (and the comparison)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objectives", default="energy,zeus_cost")
    parser.add_argument("--families", default=None, help="comma-separated families (default: all)")
    parser.add_argument("--n", default="2000,10000", help="comma-separated job lengths")
    parser.add_argument("--seeds", default="0,1", help="comma-separated seeds")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="every run, as JSON lines (needed unless --rows)")
    parser.add_argument(
        "--rows",
        type=Path,
        action="append",
        default=[],
        help="summarise these screens' rows instead of running (repeatable; needs --against)",
    )
    parser.add_argument("--by-family", action="store_true", help="also count failing runs per objective and family")
    parser.add_argument("--against", type=Path, default=None, help="a families runs file: the sweep's regrets")
    parser.add_argument("--before", type=Path, default=None, help="a previous screen's rows, to compare")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME:K=V,K=V",
                        help="a variant of the search to screen (repeatable): ProfileSettings fields or the "
                        "profiler's constants; default: the tree as it is")  # fmt: skip
    args = parser.parse_args()
    if args.rows:
        _print_rows([json.loads(line) for path in args.rows for line in path.open()], args)
        return
    if args.out is None:
        parser.error("--out is needed to run a screen")
    import power_limit_families as families

    objectives, fams = args.objectives.split(","), args.families.split(",") if args.families else None
    keys = [(c.objective, c.family, c.label, c.step_W) for c in families.cases([])
            if c.objective in objectives and (fams is None or c.family in fams)]  # fmt: skip
    variants = dict(map(_variant, args.variant or ["tree"]))
    # seed by seed, so that a run cut short still holds every variant on its first seeds
    jobs = [(k, int(s), int(n), changes) for s in args.seeds.split(",") for changes in variants.values()
            for k in keys for n in args.n.split(",")]  # fmt: skip
    name_of = {json.dumps(c, sort_keys=True): name for name, c in variants.items()}
    rows = []
    with ProcessPoolExecutor(args.workers) as pool, args.out.open("w") as f:
        for row in pool.map(_one, jobs, chunksize=2):
            row["variant"] = name_of[json.dumps(row["set"], sort_keys=True)]
            rows.append(row)
            f.write(json.dumps(row) + "\n")
            f.flush()
    _print_rows(rows, args)


def _print_rows(rows: list[dict], args: argparse.Namespace) -> None:
    """Per variant and N: the summary, next to ``--before``'s on the same runs; per family with ``--by-family``."""
    sweep = _sweep_regrets(args.against) if args.against else {}
    before = [json.loads(line) for line in args.before.open()] if args.before else []
    for row in rows:
        row.setdefault("variant", "tree")  # rows written before variants were named
    for name in sorted({r["variant"] for r in rows}):
        mine = [r for r in rows if r["variant"] == name]
        wanted = {(tuple(r["case"]), r["seed"], r["n"]) for r in mine}
        earlier = _summary([r for r in before if (tuple(r["case"]), r["seed"], r["n"]) in wanted], sweep)
        for n, s in _summary(mine, sweep).items():
            print(f"{name} N={n}: " + (f"before {earlier.get(n)}, after " if before else "") + json.dumps(s))
        if args.by_family:
            for objective, family in sorted({(r["case"][0], r["case"][1]) for r in mine}):
                at = [r for r in mine if r["case"][:2] == [objective, family] and (tuple(r["case"]), r["n"]) in sweep]
                fails = sum(_fails(r["regret"], sweep[(tuple(r["case"]), r["n"])], r["n"]) for r in at)
                print(f"  {name} {objective} {family}: {fails} of {len(at)} runs fail a target")


if __name__ == "__main__":
    main()
