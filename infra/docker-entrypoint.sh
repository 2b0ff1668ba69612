#!/bin/sh
# The image's entrypoint: `dispatcher run` with its CUDA worker fleet on every GPU the
# container sees; extra arguments are appended (`docker run IMAGE --exit-when-idle`).
# `--help`/`--version`, or a subcommand first (`docker run IMAGE backfill s3://...`), go to
# the dispatcher unchanged. exec: SIGTERM (docker stop, a Spot drain) reaches the dispatcher.
#
# GPUs, first found: PARAKEET_GPUS (as given); CUDA_VISIBLE_DEVICES (as given: the fleet pins
# each GPU's MPS daemon with that ordinal); every GPU `nvidia-smi -L` lists; else
# NVIDIA_VISIBLE_DEVICES as a list (the container renumbers those devices from 0).
set -eu

case "${1:-}" in
  -h | --help | -V | --version) exec dispatcher "$@" ;;
  "" | -*) ;;
  *) exec dispatcher "$@" ;;
esac

# "0,1,...,n-1"
ordinals() {
  i=0 list=
  while [ "$i" -lt "$1" ]; do
    list="${list:+$list,}$i"
    i=$((i + 1))
  done
  printf '%s' "$list"
}

gpus=${PARAKEET_GPUS:-${CUDA_VISIBLE_DEVICES:-}}
if [ -z "$gpus" ] && command -v nvidia-smi >/dev/null 2>&1; then
  # MIG instances are listed indented under their GPU; only whole GPUs count.
  gpus=$(ordinals "$(nvidia-smi -L | grep -c '^GPU ' || true)")
fi
if [ -z "$gpus" ]; then
  case "${NVIDIA_VISIBLE_DEVICES:-}" in
    "" | all | none | void) ;;
    *) gpus=$(ordinals "$(printf '%s\n' "$NVIDIA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)") ;;
  esac
fi
if [ -z "$gpus" ]; then
  echo "docker-entrypoint: no GPU found (run with --gpus, or set PARAKEET_GPUS=0,1)" >&2
  exit 1
fi

exec dispatcher run --config "${PARAKEET_CONFIG:-/etc/parakeet/dispatcher.toml}" \
  --gpus "$gpus" "$@"
