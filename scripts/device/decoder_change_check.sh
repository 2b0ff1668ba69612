#!/usr/bin/env bash
# The device checks of a decoder kernel change in one call (about 7 minutes): the parity and
# batch-invariance tests, two decoder_bench runs of every whole-GPU case (the targets table's
# inputs), token agreement and offline RTFx at batch 16 beside PyTorch, then the worker drill's
# single-clip steps and the MPS hammer (4 workers at 25 %) for HAMMER_S seconds. Results and
# logs under $OUT.
#
#   here:  ONLY="decoder_parity batch_invariance decoder_bench offline_bench" \
#            bash scripts/device/build_device_bins.sh
#   run:   carry [".device", ".device-fleet"], timeout_s 600, command:
#            HAMMER_S=180 bash scripts/device/decoder_change_check.sh
#
# Ran whole on 2026-12-02 (23:55-00:02 UTC, 402 s with HAMMER_S=170; docs/benchmarks.md,
# "Session 17").
set -uo pipefail
OUT=${OUT:-/tmp/decoder_check}
mkdir -p "$OUT"
stamp() { echo "--- $1 $(date -u +%T)"; }

stamp tests
for t in decoder_parity batch_invariance; do
  REQUIRE_CUDA=1 "./.device/$t" > "$OUT/$t.log" 2>&1
  echo "$t rc=$? $(grep 'test result' "$OUT/$t.log")"
done

stamp bench
for run in 1 2; do
  CUDA_TEST_SEED=7 REQUIRE_CUDA=1 ./.device/decoder_bench --ignored --nocapture \
    > "$OUT/decoder_bench.$run.log" 2>&1
  grep RESULT "$OUT/decoder_bench.$run.log" | grep 'whole GPU' | sed 's/RESULT decoder step //'
done

stamp agreement
OUT=$OUT/verify STEPS="agreement" BATCHES="16" timeout 240 bash scripts/device/gpu_verify.sh \
  > "$OUT/agreement.log" 2>&1
grep -E 'RESULT offline|^\| (PyTorch|ours)|^\| 16 ' "$OUT/agreement.log"

stamp hammer
BIN=$PWD/.device-fleet HAMMER_S=${HAMMER_S:-180} CALL_S=1 bash scripts/device/hammer_10min.sh start \
  2>&1 | grep -E 'start_to_ready|MiB|p50|hammer started' | cut -c1-300
OUT=$OUT BIN=$PWD/.device-fleet bash scripts/device/hammer_10min.sh wait 2>&1 | tail -1 | cut -c1-400
stamp end
