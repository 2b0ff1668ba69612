#!/usr/bin/env bash
# The decoder's scores (avg_logprob, no_speech_prob; model_core::scores) on the GPU machine, in
# one call from the repository root (about 5 minutes on an H200). Carries: .device/tests.tar.xz
# (the cuda-engine test binaries of scripts/device/build_device_bins.sh, packed) and
# .device-pipeline/bins.tar.xz (scripts/bench/build_pipeline_bins.sh). Writes under ${OUT:-/tmp/scores}:
#   verify/     the parity tests with REQUIRE_CUDA=1: decoder_parity (GPU scores within 1e-3 of
#               the CPU decoder's, tokens identical), batch_invariance, long_audio,
#               weight_sharing, encoder_parity, kernels
#   fixture-{cuda-f32,cuda-bf16}.json  `dispatcher transcribe --engine cuda --format
#               verbose_json` of the fixture clips with the NeMo fixture model, to compare with
#               the CPU engine's on the developer machine
set -uo pipefail
OUT=${OUT:-/tmp/scores}
BIN=${BIN:-/tmp/pipeline-bin}
mkdir -p "$OUT" .device "$BIN"
xz -dc .device/tests.tar.xz | tar -C .device -xf - || exit 1
[ -x "$BIN/dispatcher" ] || xz -dc .device-pipeline/bins.tar.xz | tar -C "$BIN" -xf - || exit 1
export LD_LIBRARY_PATH="$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
TESTS=${TESTS:-"kernels decoder_parity batch_invariance long_audio weight_sharing encoder_parity"} \
  STEPS=tests OUT=$OUT/verify bash scripts/device/gpu_verify.sh
fixtures=models/tests/fixtures
for precision in f32 bf16; do
  mkdir -p "$OUT/fixture-cuda-$precision"
  "$BIN/dispatcher" transcribe --engine cuda --cuda-encoder-precision "$precision" \
    --model $fixtures/tdt-real-options/model.nemo --format verbose_json \
    --out "$OUT/fixture-cuda-$precision" $fixtures/clips/*.wav 2>&1 | tail -3
done
