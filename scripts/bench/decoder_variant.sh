#!/usr/bin/env bash
# Builds cuda-engine test binaries (default: decoder_bench) with a variant of
# worker/cuda/kernels/decoder.cu in place of the checked-in one, into .device-verify/TEST_NAME
# (stripped; carry [".device-verify"] to the device and run them with
# scripts/device/decoder_ab.sh). The kernels are compiled at run time from the source the
# binary embeds, so each variant needs its own binary.
#
#   bash scripts/bench/decoder_variant.sh NAME patched.cu [decoder_bench decoder_parity ...]
#   bash scripts/bench/decoder_variant.sh head worker/cuda/kernels/decoder.cu   # HEAD's kernel
#
# The checked-in decoder.cu is put back on exit. Run nothing else that builds cuda-engine
# meanwhile (a worker build would embed the variant).
set -euo pipefail
cd "$(dirname "$0")/../.."
name=$1 variant=$2
shift 2
tests=("${@:-decoder_bench}")
kernel=worker/cuda/kernels/decoder.cu
saved=$(mktemp)
cp "$kernel" "$saved"
trap 'cp "$saved" "$kernel"; rm -f "$saved"' EXIT
[ "$(realpath "$variant")" = "$(realpath "$kernel")" ] || cp "$variant" "$kernel"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/work/targets/cuda}
mkdir -p .device-verify
for t in "${tests[@]}"; do
  exe=$(cargo test -p cuda-engine --release --no-run --test "$t" --message-format=json 2>/dev/null |
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])' | tail -n 1)
  [ -n "$exe" ] || { echo "no test binary for $t" >&2; exit 1; }
  cp "$exe" ".device-verify/${t}_$name"
  strip ".device-verify/${t}_$name"
  echo ".device-verify/${t}_$name"
done
