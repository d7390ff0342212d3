#!/bin/bash
# power_limit_regret_screen.py on the device machine's CPU cores (the virtual GPU; no GPU is used).
# Installs the carried wheels (.whl/), sets read-only mode all the same, and checks that the real
# card's power limit after equals the one before. Screen arguments pass through; the rows go to $OUT.
# Usage on the device: bash benchmarks/power_limit_screen_device.sh --seeds 0,1,2 --variant tree ...
# SCREEN_NAME names the output files (several screens in one call), SCREEN_TIMEOUT_S bounds one screen.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >/dev/null 2>&1 && export PYTHONPATH=/tmp/site:. || exit 3
export ZEUS_CALLBACKS_READ_ONLY=1 OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,power.limit --format=csv > "$OUT/pl_before.txt"
timeout "${SCREEN_TIMEOUT_S:-540}" python3 benchmarks/power_limit_regret_screen.py --workers "$(nproc)" \
    --out "$OUT/${SCREEN_NAME:=screen}.jsonl" --against docs/results/families_2026-12-07c/all_energy_zeus_cost_runs.jsonl "$@" \
    > "$OUT/$SCREEN_NAME.log" 2>&1
echo "screen rc=$?" >> "$OUT/$SCREEN_NAME.log"
nvidia-smi --query-gpu=name,power.limit --format=csv > "$OUT/pl_after.txt"
cmp "$OUT/pl_before.txt" "$OUT/pl_after.txt" && echo POWER_LIMIT_UNCHANGED
cat "$OUT/pl_before.txt"
tail -20 "$OUT/$SCREEN_NAME.log"
