#!/bin/bash
# The GPU acceptance run on the shared device machine (docs/results/gpu_acceptance_*.md).
# Installs the carried wheels (.whl/) beside the preinstalled frameworks, never changes a GPU setting
# (ZEUS_CALLBACKS_READ_ONLY=1), and checks that the power limit after equals the one before.
# Usage on the device: bash benchmarks/gpu_acceptance_device.sh   (writes under $OUT)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >/dev/null 2>&1 && export PYTHONPATH=/tmp/site:. || exit 3
export ZEUS_CALLBACKS_READ_ONLY=1
nvidia-smi --query-gpu=name,power.limit --format=csv > "$OUT/pl_before.txt"
timeout 540 python3 benchmarks/gpu_acceptance.py --device cuda --modes default --budget-s 240 --out "$OUT/acc" \
    > "$OUT/acc.log" 2>&1
echo "acc rc=$?" >> "$OUT/acc.log"
nvidia-smi --query-gpu=name,power.limit --format=csv > "$OUT/pl_after.txt"
cmp "$OUT/pl_before.txt" "$OUT/pl_after.txt" && echo POWER_LIMIT_UNCHANGED
cat "$OUT/pl_before.txt"
tail -30 "$OUT/acc.log"
