#!/usr/bin/env bash
# Builds what scripts/bench/pipeline_bench.sh and the SLA sweep run on the GPU machine, on the
# developer machine, stripped and packed into .device-pipeline/bins.tar.xz (carried with
# .bench-corpus/; the binaries alone, 38 MB, would not fit the 64 MiB a call may carry with the
# tracked tree; packed they take 10 MB): dispatcher, worker, offline_bench (the offline engine
# benchmark), sla_sweep, and the shared libraries the audio decoder links that the GPU machine
# lacks (libopus.so.0, libsoxr.so.0 and its OpenMP runtime libgomp.so.1). pipeline_bench.sh
# unpacks them.
# Usage: bash scripts/bench/build_pipeline_bins.sh   (CARGO_TARGET_DIR defaults to target/)
set -euo pipefail
target=${CARGO_TARGET_DIR:-target}
mkdir -p .device-pipeline
cargo build --release -p dispatcher -p worker --bins
cargo build --release -p worker-fleet --example sla_sweep
cargo test -p cuda-engine --release --test offline_bench --no-run --message-format=json 2>/dev/null \
  | python3 -c '
import json, shutil, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "offline_bench":
        shutil.copy(m["executable"], ".device-pipeline/offline_bench")
'
cp "$target"/release/{dispatcher,worker} "$target"/release/examples/sla_sweep .device-pipeline/
libs=(libopus.so.0 libsoxr.so.0 libgomp.so.1)
for lib in "${libs[@]}"; do
  cp -L "$(ldconfig -p | awk -v l="$lib" '$1 == l && /x86-64/ {print $NF; exit}')" ".device-pipeline/$lib"
done
strip .device-pipeline/{dispatcher,worker,offline_bench,sla_sweep}
tar -C .device-pipeline -cf - dispatcher worker offline_bench sla_sweep "${libs[@]}" \
  | xz -T0 -6 > .device-pipeline/bins.tar.xz
rm .device-pipeline/{dispatcher,worker,offline_bench,sla_sweep} "${libs[@]/#/.device-pipeline/}"
du -sh .device-pipeline/*
