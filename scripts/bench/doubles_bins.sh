#!/usr/bin/env bash
# The S3 and SQS doubles of pipeline_bench.sh's `doubles` step, built here from crates.io and
# packed into .device-moto/ (the GPU machine has no Rust toolchain):
#   s3s-fs 0.14.1: S3 on the file system. The newest release that builds with this
#     repository's Rust (1.95) and the first whose HEAD answers an ETag (the dispatcher names
#     results after it); it honours If-None-Match: * on PUT (write-once results) but not
#     If-Match on GET.
#   fakecloud 0.51.0: SQS (and every other service it emulates) in memory; a queue of 11 000
#     messages fills in 3 s. It builds about a hundred service crates: some 70 minutes on 2 cores,
#     and packs to 39 MB, too much to carry beside the corpus and the binaries in one device
#     call: carry .device-moto/fakecloud.xz and .device-moto/s3s-fs.xz in one call and the rest
#     in the next, while the machine is still held (ignored files stay there between calls).
# moto answers a few hundred requests per second, and its SQS rereads the clock for every queued
# message on each SendMessage (filling a queue is quadratic in its length).
# Usage: bash scripts/bench/doubles_bins.sh
set -euo pipefail
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p .device-moto
for crate in s3s-fs:0.14.1:binary fakecloud:0.51.0:; do
  IFS=: read -r name version features <<<"$crate"
  CARGO_TARGET_DIR=$work/target cargo install --quiet --locked "$name" --version "$version" \
    ${features:+--features "$features"} --root "$work/root"
  strip "$work/root/bin/$name"
  xz -T0 -9 -c "$work/root/bin/$name" > ".device-moto/$name.xz"
done
du -sh .device-moto/*.xz
