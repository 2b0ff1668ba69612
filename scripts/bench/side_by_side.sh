#!/usr/bin/env bash
# Encoder throughput, ours vs NeMo's ConformerEncoder in PyTorch eager, back to back on one GPU.
# Runs on the device machine from the repo root, with .device/encoder_bench (built here, see
# docs/cuda-engine.md) and the NeMo wheels in .whl/ (see docs/benchmarks.md) carried.
# Raw logs and the table go to ${OUT:-/tmp/bench-out}.
set -o pipefail
OUT=${OUT:-/tmp/bench-out}
mkdir -p "$OUT"
SHAPES=${SHAPES:-1x30,4x30,16x30,16x60}
export PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv;
  nvidia-smi | sed -n 3p; } | tee "$OUT/gpu.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site
ENCODER_BENCH_SHAPES=$SHAPES REQUIRE_CUDA=1 ./.device/encoder_bench --ignored --nocapture 2>&1 \
  | tee "$OUT/ours.log"
python3 scripts/bench/pytorch_encoder.py --shapes "$SHAPES" --sdpa 2>&1 | grep -v Warning \
  | tee "$OUT/pytorch.log"
python3 scripts/bench/side_by_side_table.py "$OUT/ours.log" "$OUT/pytorch.log" | tee "$OUT/table.md"
