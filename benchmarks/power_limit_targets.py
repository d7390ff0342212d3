"""Check the "Done when" targets of issue 31 against the JSON of ``power_limit_families.py``.

Reads one or more ``--json-out`` files of ``benchmarks/power_limit_families.py`` (one per
objective, or one per objective and set of families: files of the same objective with disjoint
families are merged) and, optionally, their ``--runs-out`` files (JSON lines, one per run).
Targets, each judged per row (objective × family × N, or objective × N):

- ``a``: our worst job-total regret over the full sweep's, per case, ≤ 1 at every N
  (``regret_ratio_max``);
- ``b``: the same ratio ≤ 0.5 at N ≤ 10 000;
- ``c``: our worst regret ≤ 1 % (absolute) at N ≥ 10 000 (``our_regret_pct_max``);
- ``d``: our mean gap to the true optimum below that of the sweep shrunk to our step budget,
  per objective and N (``mean_gap_pct``; a tie does not beat it);
- ``e``: ``max_slowdown`` chooses a limit slower than its bound in ≤ 5 % of the seeds of every
  case (a workload or range at one grid step) of every family, with the worst true slowdown.

A row the files cannot settle is "not measured", never a pass: an objective, family or N the
files lack (every objective of ``power_limit_families.OBJECTIVES``, every synthetic family and
both real traces are expected); for ``a``/``b``, runs whose sweep regret is not > 0 (no ratio
taken; the runs file compares them directly: ours ≤ factor × the sweep's); for ``e``, a family
with some violations but a rate ≤ 5 % over all its cases (the runs file gives the rate per case).
A target passes only when every row passes.

Prints a table (target, PASS/FAIL/NOT MEASURED, failing rows, rows not measured, worst row and
its value), then one JSON line::

    {"targets": {"a": {"status": ..., "rows": ..., "failing": ..., "not_measured": ...,
                       "worst": {"where": ..., "value": ..., "verdict": ..., "note": ...}}, ...,
                 "e": {..., "worst_true_slowdown": ...}},
     "all_pass": ...}

Usage::

    python benchmarks/power_limit_targets.py FAMILIES_JSON [FAMILIES_JSON ...] [--runs RUNS_JSONL ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's package, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmarks
from power_limit_families import OBJECTIVES, SYNTHETIC  # noqa: E402
from power_limit_regret import JOB_STEPS  # noqa: E402

from zeus_callbacks.backends.traces import GPUS  # noqa: E402

FAMILIES = (*SYNTHETIC, *GPUS)
Verdict = Literal["pass", "fail", "not measured"]
TARGETS = {
    "a": "regret ≤ sweep's, every N",
    "b": "regret ≤ 0.5 × sweep's, N ≤ 10000",
    "c": "regret ≤ 1 % absolute, N ≥ 10000",
    "d": "mean gap < shrunk sweep's, every objective",
    "e": "max_slowdown violations ≤ 5 % of seeds",
}
MAX_ABS_REGRET_PCT = 1.0
MAX_VIOLATION_RATE = 0.05
FLOAT_SLACK = 1e-9  # regrets (fractions) closer than this are equal: both 0 up to rounding (e.g. low_draw)


@dataclass(frozen=True)
class Row:
    """One checked row of a target: where, its value (None: not measured), verdict and a note."""

    target: str
    where: str
    value: float | None
    verdict: Verdict
    note: str = ""


# -- reading ---------------------------------------------------------------------------
def _merge_mean_gap(a: dict, b: dict, weights_a: tuple[int, int], weights_b: tuple[int, int]) -> dict:
    """Mean gaps of two disjoint sets of families, weighted by (our runs, cases): ours by runs, sweeps by cases."""
    out: dict = {}
    for n in a.keys() & b.keys():
        out[n] = {}
        for mode in a[n].keys() & b[n].keys():
            i = 0 if mode == "ours" else 1  # one run of each sweep per case
            wa, wb = weights_a[i], weights_b[i]
            if wa + wb > 0:
                out[n][mode] = (a[n][mode] * wa + b[n][mode] * wb) / (wa + wb)
    return out


def _weights(by_family: dict) -> tuple[int, int]:
    """(our runs, cases) over a file's families: the weights of its mean gaps."""
    return sum(f.get("runs", 0) for f in by_family.values()), sum(f.get("cases", 0) for f in by_family.values())


def load_objectives(summaries: list[dict]) -> dict[str, dict]:
    """``by_objective`` of several families summaries, merged.

    Files of the same objective must hold disjoint families; their per-family rows are joined
    and their mean gaps averaged with their run counts as weights.

    Raises:
        ValueError: if two files hold the same family of the same objective.
    """
    merged: dict[str, dict] = {}
    for summary in summaries:
        for objective, entry in summary.get("by_objective", {}).items():
            if objective not in merged:
                merged[objective] = {**entry, "by_family": dict(entry.get("by_family", {}))}
                continue
            have = merged[objective]
            twice = have["by_family"].keys() & entry.get("by_family", {}).keys()
            if twice:
                raise ValueError(f"{objective}: families {sorted(twice)} are in two files")
            if "mean_gap_pct" in have and "mean_gap_pct" in entry:
                weights = _weights(have["by_family"]), _weights(entry["by_family"])
                have["mean_gap_pct"] = _merge_mean_gap(have["mean_gap_pct"], entry["mean_gap_pct"], *weights)
            else:
                have.pop("mean_gap_pct", None)  # one file lacks it: the merged mean is unknown
            have["by_family"].update(entry["by_family"])
    return merged


def load_runs(lines: list[str]) -> list[dict]:
    """Rows of ``--runs-out`` files (JSON lines; blank lines skipped)."""
    return [json.loads(line) for line in lines if line.strip()]


# -- checking --------------------------------------------------------------------------
def _regret_entry(objectives: dict, objective: str, family: str, n: int) -> dict | None:
    """The family's regret entry at N, or None where the files lack it."""
    fam = objectives.get(objective, {}).get("by_family", {}).get(family)
    if fam is None:
        return None
    return fam.get("regret", {}).get(str(n))


def _unratioed_fail_count(runs: list[dict], objective: str, family: str, n: int, factor: float) -> tuple[int, int]:
    """(runs failing, runs compared) where the sweep's regret is not > 0: ours ≤ factor × sweep's."""
    sweeps = {r["case"]: r["regret"][str(n)] for r in runs
              if r["objective"] == objective and r["family"] == family and r["mode"] == "sweep"}  # fmt: skip
    compared = failing = 0
    for r in runs:
        if r["objective"] != objective or r["family"] != family or r["mode"] != "ours":
            continue
        sweep = sweeps.get(r["case"])
        if sweep is None or sweep > 0.0:
            continue
        compared += 1
        failing += r["regret"][str(n)] > factor * sweep + FLOAT_SLACK
    return failing, compared


def check_ratio(
    target: str, objectives: dict, runs: list[dict] | None, factor: float, job_steps: tuple[int, ...]
) -> list[Row]:
    """Targets ``a``/``b``: our regret ≤ ``factor`` × the sweep's, per objective, family and N."""
    rows = []
    for objective in OBJECTIVES:
        for family in FAMILIES:
            for n in job_steps:
                where = f"{objective} / {family} / N={n}"
                g = _regret_entry(objectives, objective, family, n)
                if g is None:
                    rows.append(Row(target, where, None, "not measured", "not in the files"))
                    continue
                ratio = g.get("regret_ratio_max")
                verdict: Verdict = "fail" if ratio is not None and ratio > factor else "pass"
                note = ""
                if g.get("no_ratio", 0) > 0 and verdict == "pass":
                    if runs is None:
                        verdict, note = "not measured", f"{g['no_ratio']} runs with a sweep regret ≤ 0 (give --runs)"
                    else:
                        failing, compared = _unratioed_fail_count(runs, objective, family, n, factor)
                        if compared < g["no_ratio"]:
                            verdict, note = "not measured", f"{g['no_ratio'] - compared} runs missing from --runs"
                        elif failing:
                            verdict, note = "fail", f"{failing} runs above {factor:g} × a sweep regret ≤ 0"
                        else:
                            note = f"{compared} runs against a sweep regret ≤ 0: ours ≤ {factor:g} × it"
                rows.append(Row(target, where, ratio, verdict, note))
    return rows


def check_absolute(objectives: dict) -> list[Row]:
    """Target ``c``: our worst regret ≤ 1 % at N ≥ 10 000, per objective and family."""
    rows = []
    for objective in OBJECTIVES:
        for family in FAMILIES:
            for n in (n for n in JOB_STEPS if n >= 10_000):
                where = f"{objective} / {family} / N={n}"
                g = _regret_entry(objectives, objective, family, n)
                if g is None or "our_regret_pct_max" not in g:
                    rows.append(Row("c", where, None, "not measured", "not in the files"))
                    continue
                value = g["our_regret_pct_max"]
                rows.append(Row("c", where, value, "pass" if value <= MAX_ABS_REGRET_PCT else "fail", "regret %"))
    return rows


def check_mean_gap(objectives: dict) -> list[Row]:
    """Target ``d``: our mean gap < the shrunk sweep's, per objective and N (value: ours − shrunk, % points)."""
    rows = []
    for objective in OBJECTIVES:
        for n in JOB_STEPS:
            where = f"{objective} / N={n}"
            g = objectives.get(objective, {}).get("mean_gap_pct", {}).get(str(n), {})
            if "ours" not in g or "shrunk" not in g:
                rows.append(Row("d", where, None, "not measured", "not in the files"))
                continue
            value = g["ours"] - g["shrunk"]
            note = f"ours {g['ours']:.4f} %, shrunk sweep {g['shrunk']:.4f} %"
            rows.append(Row("d", where, value, "pass" if value < 0.0 else "fail", note))
    return rows


def _case_rates(runs: list[dict], family: str) -> dict[str, tuple[int, int, float]]:
    """Per case of a ``max_slowdown`` family: (violating runs, runs, worst true slowdown) of ours."""
    out: dict[str, tuple[int, int, float]] = {}
    for r in runs:
        if r["objective"] == "max_slowdown" and r["family"] == family and r["mode"] == "ours":
            v, k, s = out.get(r["case"], (0, 0, 0.0))
            out[r["case"]] = (v + bool(r["violates"]), k + 1, max(s, r["slowdown"]))
    return out


def check_violations(objectives: dict, runs: list[dict] | None) -> list[Row]:
    """Target ``e``: ``max_slowdown`` violation rate ≤ 5 % on every case of every family (value: the rate)."""
    rows = []
    for family in FAMILIES:
        where = f"max_slowdown / {family}"
        f = objectives.get("max_slowdown", {}).get("by_family", {}).get(family)
        if f is None or "violations" not in f or not f.get("runs"):
            rows.append(Row("e", where, None, "not measured", "not in the files"))
            continue
        rate = f["violations"] / f["runs"]
        note = f"{f['violations']}/{f['runs']} runs, worst true slowdown {f.get('worst_slowdown', float('nan')):.3f}"
        if f["violations"] == 0:
            rows.append(Row("e", where, 0.0, "pass", note))
        elif rate > MAX_VIOLATION_RATE:  # then some case's rate is above it too
            rows.append(Row("e", where, rate, "fail", note))
        elif runs is None:
            rows.append(Row("e", where, rate, "not measured", note + "; per-case rates need --runs"))
        else:
            per_case = _case_rates(runs, family)
            if sum(k for _, k, _ in per_case.values()) < f["runs"]:
                rows.append(Row("e", where, rate, "not measured", note + "; runs missing from --runs"))
                continue
            case, (v, k, s) = max(per_case.items(), key=lambda item: item[1][0] / item[1][1])
            verdict: Verdict = "fail" if v / k > MAX_VIOLATION_RATE else "pass"
            rows.append(Row("e", f"{where} / {case}", v / k, verdict, f"{v}/{k} runs, worst true slowdown {s:.3f}"))
    return rows


def worst_true_slowdown(objectives: dict) -> float | None:
    """Our worst true slowdown over every ``max_slowdown`` family (time over that at the maximum limit), or None."""
    families = objectives.get("max_slowdown", {}).get("by_family", {}).values()
    slowdowns = [f["worst_slowdown"] for f in families if "worst_slowdown" in f]
    return max(slowdowns) if slowdowns else None


def check_all(objectives: dict, runs: list[dict] | None) -> list[Row]:
    """Every row of every target."""
    return [
        *check_ratio("a", objectives, runs, 1.0, JOB_STEPS),
        *check_ratio("b", objectives, runs, 0.5, tuple(n for n in JOB_STEPS if n <= 10_000)),
        *check_absolute(objectives),
        *check_mean_gap(objectives),
        *check_violations(objectives, runs),
    ]


def summarise(rows: list[Row]) -> dict[str, dict]:
    """Per target: status (FAIL if a row fails, else NOT MEASURED if one is, else PASS), counts, worst row.

    The worst row is the failing one with the largest value, else the measured one with the
    largest value, else the first one not measured.
    """
    out = {}
    for target in TARGETS:
        mine = [r for r in rows if r.target == target]
        failing = [r for r in mine if r.verdict == "fail"]
        unmeasured = [r for r in mine if r.verdict == "not measured"]
        status = "FAIL" if failing else "NOT MEASURED" if unmeasured or not mine else "PASS"
        valued = [r for r in (failing or mine) if r.value is not None]
        worst = max(valued, key=lambda r: r.value or 0.0) if valued else (unmeasured or [None])[0]
        out[target] = {
            "status": status, "rows": len(mine), "failing": len(failing), "not_measured": len(unmeasured),
            "worst": None if worst is None else {"where": worst.where, "value": worst.value, "verdict": worst.verdict,
                                                 "note": worst.note},
        }  # fmt: skip
    return out


def table(summary: dict[str, dict]) -> str:
    """The summary as a markdown table."""
    lines = [
        "| target | status | failing rows | not measured | worst row | value |",
        "|---|---|---|---|---|---|",
    ]
    for target, s in summary.items():
        w = s["worst"]
        where = "—" if w is None else f"{w['where']}" + (f" ({w['note']})" if w["note"] else "")
        value = "—" if w is None or w["value"] is None else f"{w['value']:.4g}"
        lines.append(
            f"| {target}: {TARGETS[target]} | {s['status']} | {s['failing']}/{s['rows']} | {s['not_measured']} | "
            f"{where} | {value} |"
        )
    return "\n".join(lines)


def main() -> None:
    """Read the files, print the table, then one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("summaries", type=Path, nargs="+", help="--json-out files of power_limit_families.py")
    parser.add_argument("--runs", type=Path, action="append", default=[], help="its --runs-out files (repeatable)")
    parser.add_argument("--rows", action="store_true", help="also print every row that fails or is not measured")
    args = parser.parse_args()
    objectives = load_objectives([json.loads(p.read_text(encoding="utf-8")) for p in args.summaries])
    runs = load_runs([line for p in args.runs for line in p.read_text(encoding="utf-8").splitlines()])
    rows = check_all(objectives, runs if args.runs else None)
    summary = summarise(rows)
    summary["e"]["worst_true_slowdown"] = worst_true_slowdown(objectives)
    print(table(summary))
    if args.rows:
        for r in rows:
            if r.verdict != "pass":
                print(f"{r.target} {r.verdict}: {r.where} value {r.value} {r.note}")
    print(json.dumps({"targets": summary, "all_pass": all(s["status"] == "PASS" for s in summary.values())}))


if __name__ == "__main__":
    main()
