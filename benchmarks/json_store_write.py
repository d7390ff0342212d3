"""The JSON store's write: its text now (one record a line, the C encoder) against ``json.dump(indent=1)``.

Every write of the JSON store reads, checks and rewrites the whole file, so its cost grows with the
trials it holds (docs/stores.md). This times one write of a store of N trials both ways, side by side in
one process (the two formats alternate, so machine noise hits both), and one real store write
(``finish_trial``: lock, read, check, write, fsync) at each N.

    PYTHONPATH=. python benchmarks/json_store_write.py --trials 200 800 --repeats 15

The last line is one JSON object: per N, the median text time of each format (ms), their ratio and the
median whole write (ms).
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import tempfile
import time
from pathlib import Path

from zeus_callbacks.store import open_store
from zeus_callbacks.store._json_store import document_text


def _store_of(trials: int, folder: Path) -> tuple[Path, int]:
    path = folder / f"store_{trials}.json"
    with open_store(path) as store:
        store.ensure_job("job")
        last = 0
        for i in range(trials):
            trial = store.create_trial("job", batch_size=8 + i % 4, power_limit_W=200.0, info={"i": i})
            store.finish_trial(trial.trial_id, status="completed", energy_J=float(i), time_s=1.0, cost=float(i),
                               converged=True)  # fmt: skip
            last = trial.trial_id
    return path, last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, nargs="+", default=[200, 800])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.trials:
            path, last = _store_of(n, Path(tmp))
            doc = json.loads(path.read_text())
            indent_ms, lines_ms, write_ms = [], [], []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                json.dump(doc, io.StringIO(), indent=1, sort_keys=True)
                t1 = time.perf_counter()
                document_text(doc)
                t2 = time.perf_counter()
                indent_ms.append(1e3 * (t1 - t0))
                lines_ms.append(1e3 * (t2 - t1))
                with open_store(path) as store:
                    t3 = time.perf_counter()
                    store.finish_trial(last, status="completed", energy_J=1.0, time_s=1.0, cost=1.0, converged=True)
                    write_ms.append(1e3 * (time.perf_counter() - t3))
            row = {
                "indent_text_ms": statistics.median(indent_ms),
                "lines_text_ms": statistics.median(lines_ms),
                "ratio": statistics.median(indent_ms) / statistics.median(lines_ms),
                "store_write_ms": statistics.median(write_ms),
            }
            results[n] = row
            print(
                f"{n} trials: json.dump(indent=1) {row['indent_text_ms']:.1f} ms, one record a line "
                f"{row['lines_text_ms']:.1f} ms ({row['ratio']:.1f}x); a store write {row['store_write_ms']:.1f} ms"
            )
    print(json.dumps({str(k): {key: round(v, 2) for key, v in row.items()} for k, row in results.items()}))


if __name__ == "__main__":
    main()
