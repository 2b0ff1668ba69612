#!/usr/bin/env bash
# Builds decoder test binaries (decoder_bench, decoder_parity, batch_invariance) from several
# branches or commits into .device-verify/TEST_NAME, checking each out in turn (so a variant
# that also changes the host code builds whole), then returns to the branch it started on.
# Needs a clean working tree. Run the binaries on the device with
# scripts/device/decoder_ab.sh (timing) and REQUIRE_CUDA=1 ./.device-verify/decoder_parity_NAME.
#
#   bash scripts/bench/decoder_branch_variants.sh main:head wip/writer-major:wm
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -z "$(git status --porcelain --untracked-files=no)" ] || { echo "the working tree is not clean" >&2; exit 1; }
start=$(git symbolic-ref --quiet --short HEAD || git rev-parse HEAD)
trap 'git checkout -q "$start"' EXIT
for spec in "$@"; do
  rev=${spec%%:*} name=${spec##*:}
  git checkout -q "$rev"
  bash scripts/bench/decoder_variant.sh "$name" worker/cuda/kernels/decoder.cu \
    decoder_bench decoder_parity batch_invariance
done
