#!/usr/bin/env bash
# GPU faults under MPS while the main job runs (issue 30): `dispatcher local --gpus`
# with 4 CUDA workers per GPU under MPS, started with `--worker-arg=--fault-injection`; mid-run
# one transcription worker of GPU 0 gets SIGUSR1 (an illegal-address fault on its context),
# later another gets SIGUSR2 (it takes all free device memory). Expected: GPU 0's group
# restarts (every worker of its MPS server), the other GPUs' workers keep their processes,
# every recording ends done (none failed, none lost), the dispatcher exits 0.
# From the repository root on the GPU machine, with the pipeline benchmark's inputs
# (.bench-corpus/ and .device-pipeline/bins.tar.xz; scripts/bench/build_pipeline_bins.sh).
#   GPUS=0 or 0,1 (default: every GPU), HOURS of audio (default 2), OUT (default /tmp/faults)
set -uo pipefail
OUT=${OUT:-/tmp/faults}
BIN=${BIN:-/tmp/pipeline-bin}
MODEL=${MODEL:-/tmp/parakeet-random.nemo}
CORPUS=${CORPUS:-/tmp/fault-corpus}
GPUS=${GPUS:-$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd, -)}
mkdir -p "$OUT"
OUT=$OUT/prep STEPS="model corpus" HOURS=${HOURS:-2} LONG_COPIES=0 CORPUS=$CORPUS BIN=$BIN \
  MODEL=$MODEL bash scripts/bench/pipeline_bench.sh > "$OUT/prep.log" 2>&1
export LD_LIBRARY_PATH="$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
inputs=$(find "$CORPUS" -type f | wc -l)
echo "inputs: $inputs recordings; GPUs: $GPUS"

# Transcription workers of one GPU's MPS group: "pid" lines.
workers_of() {
  local gpu=$1
  for pid in $(pgrep -x worker); do
    tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -q "^CUDA_MPS_PIPE_DIRECTORY=.*/gpu$gpu$" \
      && tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q -- '--task transcribe' && echo "$pid"
  done
}

rm -rf /tmp/fault-spool /tmp/fault-store /tmp/fault-fleet
"$BIN/dispatcher" local --spool /tmp/fault-spool --store /tmp/fault-store --input-dir "$CORPUS" \
  --model "$MODEL" --gpus "$GPUS" --instances-per-gpu 4 \
  --runtime-dir /tmp/fault-fleet --progress-interval-s 5 --worker-arg=--fault-injection \
  > "$OUT/dispatcher.log" 2>&1 &
dispatcher=$!
ngpus=$(echo "$GPUS" | tr ',' '\n' | wc -l)
for _ in $(seq 600); do
  [ "$(grep -c 'worker ready' "$OUT/dispatcher.log")" -ge $((4 * ngpus)) ] && break
  sleep 0.5
done
sleep 8  # jobs in flight on every worker
others_before=""
for gpu in $(echo "$GPUS" | tr ',' ' '); do
  [ "$gpu" = "$(echo "$GPUS" | cut -d, -f1)" ] || others_before="$others_before $(workers_of "$gpu" | sort | tr '\n' ' ')"
done
first=$(echo "$GPUS" | cut -d, -f1)
victim=$(workers_of "$first" | head -1)
echo "$(date -u +%T) SIGUSR1 (illegal address) to worker $victim of GPU $first" | tee -a "$OUT/drill.txt"
kill -USR1 "$victim"
sleep 20
for _ in $(seq 120); do
  victim=$(workers_of "$first" | head -1)
  [ -n "$victim" ] && break
  sleep 0.5
done
echo "$(date -u +%T) SIGUSR2 (out of memory) to worker $victim of GPU $first" | tee -a "$OUT/drill.txt"
kill -USR2 "$victim"
wait "$dispatcher"
rc=$?
others_after=""
for gpu in $(echo "$GPUS" | tr ',' ' '); do
  [ "$gpu" = "$first" ] || others_after="$others_after $(grep -o "worker ready group=gpu$gpu.*pid=[0-9]*" "$OUT/dispatcher.log" | grep -o 'pid=[0-9]*' | sort | tr '\n' ' ')"
done
sed -i 's/\x1b\[[0-9;]*m//g' "$OUT/dispatcher.log"
{
  echo "dispatcher exit status: $rc"
  grep -E '^done [0-9]+ · already done' "$OUT/dispatcher.log" | tail -1
  echo "restarts by group and cause:"
  grep 'restarting worker' "$OUT/dispatcher.log" | grep -o 'group=[a-z0-9]* .*cause=[A-Za-z]*' \
    | sed -E 's/ slot=[0-9]+ task=[^ ]+ pid=[0-9]+//' | sort | uniq -c
  grep -E 'fault injected|fatal CUDA fault|out of device memory|MPS client terminated|terminate_client failed|receiving paused|receiving resumed' \
    "$OUT/dispatcher.log" | cut -c1-220 | head -20
  echo "other GPUs' transcription workers before the faults:$others_before"
  echo "other GPUs' 'worker ready' pids over the run:$others_after"
  echo "inputs: $inputs"
} | tee -a "$OUT/drill.txt"
