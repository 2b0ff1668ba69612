#!/usr/bin/env bash
# moto's server for S3 and SQS, installed for the GPU machine's Python 3.12 (which has no package
# registry) and packed into .device-moto/moto-site.tar.xz for pipeline_bench.sh's `moto` step.
# botocore's service models other than those moto's S3 and SQS load are dropped (32 -> 6 MB):
# the whole wheel set (31 MB) would not fit a device call's 64 MiB beside the corpus and the
# binaries; packed, this is about 12 MB.
# Usage: PYTHON312=/path/to/python3.12 bash scripts/bench/moto_site.sh   (default: python3.12)
set -euo pipefail
py=${PYTHON312:-python3.12}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$py" -m pip download -q --only-binary=:all: -d "$work/wheels" "moto[s3,sqs]==5.2.5" flask flask-cors
"$py" -m pip install -q --no-deps --target "$work/moto-site" "$work"/wheels/*.whl
for d in "$work"/moto-site/botocore/data/*/; do
  case "$(basename "$d")" in s3 | sqs | sts | iam | cloudwatch | kms) ;; *) rm -rf "$d" ;; esac
done
find "$work/moto-site" -name __pycache__ -prune -exec rm -rf {} +
mkdir -p .device-moto
tar -C "$work" -cf - moto-site | xz -T0 -6 > .device-moto/moto-site.tar.xz
du -sh .device-moto/moto-site.tar.xz
