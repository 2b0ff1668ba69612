#!/usr/bin/env bash
# On the device: decoder_bench binaries built by scripts/bench/decoder_variant.sh, run in turn
# ROUNDS times (alternating, so that the machine's drift hits each alike); prints the bf16
# whole-GPU lines of batch 1 and 16 (µs per step: whole decode, launch alone), full logs under
# $OUT/ab. An optional environment for a run follows its name after a colon.
#
#   bash scripts/device/decoder_ab.sh 2 decoder_bench_head decoder_bench_new
#   bash scripts/device/decoder_ab.sh 1 "decoder_bench_new:CUDA_TEST_SEED=8"
set -uo pipefail
rounds=$1
shift
mkdir -p "${OUT:-/tmp}/ab"
for round in $(seq "$rounds"); do
  n=0
  for spec in "$@"; do
    n=$((n + 1))
    bin=${spec%%:*} env_vars=
    [ "$bin" = "$spec" ] || env_vars=${spec#*:}
    log="${OUT:-/tmp}/ab/$n.$bin.$round.log"
    env CUDA_TEST_SEED="${CUDA_TEST_SEED:-7}" REQUIRE_CUDA=1 $env_vars \
      "./.device-verify/$bin" --ignored --nocapture > "$log" 2>&1
    echo "=== $spec round $round rc=$?"
    grep "bf16 whole GPU batch=\(1\|16\) " "$log" |
      sed -e 's/RESULT decoder step bf16 whole GPU //' -e 's/ frames=375://'
  done
done
