#!/usr/bin/env bash
# Issue 25's proof: N consecutive .ci/run on clean clones of this repository at COMMIT, each with
# `stress-ng --cpu 2` (Debian package stress-ng) running beside it. One line per run goes to
# RESULTS (rc, wall time, pytest's summary line); each run's full log is kept next to its clone.
# Usage: .ci/stress_proof.sh COMMIT [N=10] [WORKDIR=/tmp/ci-stress]
set -u
repo=$(cd "$(dirname "$0")/.." && pwd)
commit=$1 n=${2:-10} work=${3:-/tmp/ci-stress}
mkdir -p "$work"
for i in $(seq 1 "$n"); do
    dir=$work/run$i
    rm -rf "$dir"
    git clone -q "$repo" "$dir" && git -C "$dir" checkout -q "$commit"
    stress-ng --cpu 2 --timeout 0 >/dev/null 2>&1 &
    stress=$!
    start=$(date +%s)
    (cd "$dir" && timeout 3600 ./.ci/run) >"$dir.log" 2>&1
    rc=$?
    end=$(date +%s)
    kill "$stress"; wait "$stress" 2>/dev/null; pkill stress-ng
    summary=$(grep -E "(passed|failed).* in [0-9.]+s" "$dir.log" | head -1)
    echo "run $i commit $commit rc=$rc wall_s=$((end - start)) start=$(date -d @"$start" +%H:%M:%S) :: $summary" >>"$work/RESULTS"
    rm -rf "$dir/.ci-venv" "$dir/.ci-core-venv"  # ~2 GB each
done
