#!/usr/bin/env bash
# One device call: the raw-loop and Fabric examples on the GPU (measure(), CUDA-event marks), and what
# the host's powercap (RAPL) tree exposes. Read-only: the power limit is compared before and after.
set -u
export ZEUS_CALLBACKS_READ_ONLY=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site
before=$(nvidia-smi --query-gpu=power.limit --format=csv,noheader)
cd "$OUT"
python3 "$OLDPWD/examples/raw_loop.py" --epochs 3 --summary-json raw_loop_summary.json > raw_loop.txt 2>&1; echo "raw_loop rc=$?"
python3 "$OLDPWD/examples/fabric_loop.py" --epochs 3 --summary-json fabric_summary.json > fabric.txt 2>&1; echo "fabric rc=$?"
cp -r zeus_logs logs 2>/dev/null
{ echo "id: $(id)"; echo "kernel: $(uname -r)"; ls -d /sys/class/powercap/* 2>&1
  for d in /sys/class/powercap/intel-rapl*; do [ -d "$d" ] || continue
    echo "$d name=$(cat $d/name 2>&1) max_energy_range_uj=$(cat $d/max_energy_range_uj 2>&1) energy_uj=$(cat $d/energy_uj 2>&1)"; done
  grep -m1 "model name" /proc/cpuinfo; } > powercap.txt 2>&1
after=$(nvidia-smi --query-gpu=power.limit --format=csv,noheader)
echo "power limit before=$before after=$after same=$([ "$before" == "$after" ] && echo yes || echo NO)"
tail -5 raw_loop.txt fabric.txt; cat powercap.txt
