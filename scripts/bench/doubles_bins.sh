#!/usr/bin/env bash
# The S3 and SQS doubles of pipeline_bench.sh's `doubles` step, built here and packed into
# .device-moto/ (the GPU machine has no Rust toolchain):
#   s3-memory (scripts/bench/s3-memory, this repository): S3 in memory on the s3s crate's
#     protocol; the double that answers faster than the dispatcher asks (s3s-fs does not, under
#     hundreds of jobs in flight: see its source's header).
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
# Usage: bash scripts/bench/doubles_bins.sh   (DOUBLES="s3-memory" builds that one alone)
set -euo pipefail
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p .device-moto
for double in ${DOUBLES:-s3-memory s3s-fs fakecloud}; do
  case $double in
    s3-memory)
      CARGO_TARGET_DIR=$work/target cargo build --quiet --locked --release \
        --manifest-path scripts/bench/s3-memory/Cargo.toml
      bin=$work/target/release/s3-memory ;;
    s3s-fs | fakecloud)
      version=0.14.1 features=binary
      [ "$double" = fakecloud ] && version=0.51.0 features=
      CARGO_TARGET_DIR=$work/target cargo install --quiet --locked "$double" \
        --version "$version" ${features:+--features "$features"} --root "$work/root"
      bin=$work/root/bin/$double ;;
    *) echo "unknown double $double (s3-memory, s3s-fs, fakecloud)" >&2; exit 1 ;;
  esac
  strip "$bin"
  xz -T0 -9 -c "$bin" > ".device-moto/$double.xz"
done
du -sh .device-moto/*.xz
