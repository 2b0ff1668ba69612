#!/usr/bin/env bash
# Builds what the device scripts run, on the developer machine, stripped, into the folders the
# device calls carry (each under the 64 MiB a call may carry with the tracked tree):
#   .device/        every cuda-engine test binary (kernels, parity tests, benches) for
#                   scripts/device/gpu_verify.sh
#   .device-fleet/  worker, fleet and hammer for scripts/device/gpu_fleet_drill.sh and
#                   scripts/device/hammer_10min.sh
# Usage: bash scripts/device/build_device_bins.sh   (CARGO_TARGET_DIR defaults to
# /work/targets/cuda). Then run(..., carry=[".device"]) or carry=[".device-fleet"].
# ONLY="decoder_parity batch_invariance ..." copies only those test binaries into .device (and
# removes the others there), so that .device and .device-fleet fit in one call's carry
# (scripts/device/decoder_change_check.sh).
set -euo pipefail
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/work/targets/cuda}
mkdir -p .device .device-fleet
if [ -n "${ONLY:-}" ]; then rm -f .device/*; fi
cargo test -p cuda-engine --release --no-run --message-format=json 2>/dev/null | ONLY="${ONLY:-}" python3 -c '
import json, os, shutil, sys
only = os.environ["ONLY"].split()
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        name = m["target"]["name"]
        name = "unit" if name == "cuda_engine" else name
        if not only or name in only:
            shutil.copy(m["executable"], ".device/" + name)
'
cargo build --release -p worker -p worker-fleet --bins --examples
cp "$CARGO_TARGET_DIR"/release/{worker,fleet} "$CARGO_TARGET_DIR"/release/examples/hammer .device-fleet/
strip .device/* .device-fleet/*
du -sh .device .device-fleet
