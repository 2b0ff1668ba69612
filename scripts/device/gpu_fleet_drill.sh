#!/usr/bin/env bash
# The GPU machine drill for the worker fleet and the CUDA engine (docs/operations.md,
# docs/benchmarks.md), from the repository root with release binaries in .device/ (worker,
# fleet, hammer). Writes logs under ${OUT:-/tmp/drill}. Steps (STEPS=..., default all):
#   model    random full-size Parakeet .nemo (scripts/bench/make_random_parakeet.py), calibrated
#            to audio-dependent tokens (scripts/bench/calibrate_random_parakeet.py)
#   probe    `worker probe` without MPS
#   single   one CUDA worker: start-to-ready time (a first start, then a restart), GPU memory,
#            one 45 s clip end to end
#   memory   4 workers at 25 % under MPS serving for MEM_S seconds (default 30), once with the
#            encoder weights shared per GPU (the fleet's default) and once private
#            (--no-weight-sharing): GPU memory in use (nvidia-smi, whole GPU, MPS server included)
#            sampled every second; memory.txt has the steady state per instance
#   mps4     4 workers at 25 % under MPS: probes, SIGKILL of one -> group restart, clean stop
#            (DRILL_ARGS: more hammer/fleet options for mps4 and mps8, e.g.
#            --worker-arg=--cuda-sync=spin)
#   mps8     8 workers at 12 %: same
#   twogpu   (2 GPUs) 4 workers per GPU, one MPS domain each; SIGKILL in GPU 0's group restarts
#            only GPU 0's workers while GPU 1's keep serving
#   scaling  (2 GPUs) throughput with 4 workers on GPU 0, then 4 per GPU on GPUs 0 and 1
#   hammer   4 workers at 25 % for HAMMER_S seconds (default 540), every answer vs golden; with
#            DIAR_MODEL (a Sortformer .nemo), also 8 diarization workers at 12 % under the same
#            daemon, 8 threads diarizing the same clips, every answer vs golden
set -uo pipefail
OUT=${OUT:-/tmp/drill}
STEPS=${STEPS:-model probe single mps4 mps8}
MODEL=${MODEL:-/tmp/parakeet-random.nemo}
DUR=${DUR:-40}
mkdir -p "$OUT"
export RUST_LOG=${RUST_LOG:-warn}
BIN=${BIN:-$PWD/.device}
CLIPS=$(ls models/tests/fixtures/clips/{audioeval_counting,audioeval_fox,espeak_gb_fast,espeak_us,long}.wav | paste -sd,)
has() { [[ " $STEPS " == *" $1 "* ]]; }
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv; } | tee "$OUT/gpu.txt"

if has model; then
  # Calibrated, so tokens depend on the audio (plain random weights decode one token on every
  # frame, which would make the golden comparisons blind to numerical errors).
  python3 scripts/bench/make_random_parakeet.py --out "$MODEL.random" 2>&1 | tail -1
  python3 scripts/bench/calibrate_random_parakeet.py --model "$MODEL.random" --out "$MODEL" \
    2>&1 | tail -1
  python3 - <<'PY'
import wave, struct
# 45 s of the fixture speech, concatenated (for the end-to-end latency step).
frames = b""
names = ["long", "espeak_us", "audioeval_counting", "espeak_gb_fast", "audioeval_fox", "long"]
for n in names:
    with wave.open(f"models/tests/fixtures/clips/{n}.wav") as w:
        frames += w.readframes(w.getnframes())
frames = frames[: 45 * 16000 * 2]
with wave.open("/tmp/clip45.wav", "wb") as w:
    w.setnchannels(1); w.setsampwidth(2); w.setframerate(16000); w.writeframes(frames)
print("clip45", len(frames) / 32000, "s")
PY
fi

if has probe; then
  "$BIN/worker" probe 2>&1 | tee "$OUT/probe.txt"
fi

if has single; then
  : > "$OUT/single.txt"
  # Twice: the first start on a fresh machine also fills the driver's JIT cache (the kernels'
  # PTX compiled for this GPU, ~/.nv/ComputeCache), the second is a restart's.
  for start_kind in first restart; do
    rm -f /tmp/w1.sock
    jit_cache=$(du -sk ~/.nv/ComputeCache 2>/dev/null | cut -f1)
    start=$(date +%s.%N)
    RUST_LOG=info "$BIN/worker" serve --engine cuda --model "$MODEL" --socket /tmp/w1.sock \
      2> "$OUT/single-worker-$start_kind.log" &
    pid=$!
    while [ ! -S /tmp/w1.sock ] && kill -0 $pid 2>/dev/null; do sleep 0.05; done
    ready=$(date +%s.%N)
    echo "start_to_ready_s $(python3 -c "print(round($ready - $start, 2))") ($start_kind start," \
      "JIT cache ${jit_cache:-0} KiB before)" | tee -a "$OUT/single.txt"
    grep -o 'engine ready.*' "$OUT/single-worker-$start_kind.log" | sed 's/\x1b\[[0-9;]*m//g' \
      | tee -a "$OUT/single.txt"
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | tee -a "$OUT/single.txt"
    kill $pid; wait $pid 2>/dev/null
  done
  "$BIN/hammer" --engine cuda --model "$MODEL" --worker-binary "$BIN/worker" --clips /tmp/clip45.wav \
    --gpus 0 --instances-per-gpu 1 --no-mps --skip-golden --concurrency 1 --duration-s 15 \
    --runtime-dir /tmp/fleet-single 2>&1 | grep -E '"summary"' | tee "$OUT/latency45.json"
fi

if has memory; then
  for mode in shared private; do
    flag=(); [ "$mode" = private ] && flag=(--no-weight-sharing)
    base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
    RUST_LOG=warn,worker=info "$BIN/hammer" --engine cuda --model "$MODEL" --worker-binary "$BIN/worker" --clips "$CLIPS" \
      --gpus 0 --instances-per-gpu 4 --concurrency 16 --duration-s "${MEM_S:-30}" --skip-golden \
      "${flag[@]}" --runtime-dir "/tmp/fleet-mem-$mode" > "$OUT/memory-$mode.log" 2>&1 &
    hp=$!
    : > "$OUT/memory-$mode.samples"
    while kill -0 $hp 2>/dev/null; do
      nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1 >> "$OUT/memory-$mode.samples"
      [ "$(wc -l < "$OUT/memory-$mode.samples")" -eq $(( ${MEM_S:-30} )) ] && \
        nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader > "$OUT/memory-$mode.apps"
      sleep 1
    done
    wait $hp
    grep -E '"summary"' "$OUT/memory-$mode.log" | cut -c1-300
    grep -E 'shared encoder weights' "$OUT/memory-$mode.log" | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-200 | tee -a "$OUT/memory.txt"
    # Steady state: the median of the last third of the samples (serving, after every load).
    python3 - "$OUT/memory-$mode.samples" "$base" "$mode" <<'PY' | tee -a "$OUT/memory.txt"
import statistics, sys
samples = [int(x) for x in open(sys.argv[1]) if x.strip()]
base, mode = int(sys.argv[2]), sys.argv[3]
steady = statistics.median(samples[-max(1, len(samples) // 3):])
print(f"memory {mode}: idle {base} MiB, peak {max(samples)} MiB, steady {steady:.0f} MiB, "
      f"per instance (steady - idle) / 4 = {(steady - base) / 4:.0f} MiB")
PY
    sleep 2
  done
fi

drill() { # instances percentage
  "$BIN/hammer" --engine cuda --model "$MODEL" --worker-binary "$BIN/worker" --clips "$CLIPS" \
    --gpus 0 --instances-per-gpu "$1" --concurrency $((4 * $1)) --duration-s "$DUR" \
    --kill-after-s $((DUR / 3)) --kill-group gpu0 --runtime-dir "/tmp/fleet-mps$1" ${DRILL_ARGS:-} 2>&1 \
    | tee "$OUT/mps$1.log" | grep -vE 'MISMATCH|FAILED' | cut -c1-3000
  sleep 2; echo "MPS processes after stop: $(pgrep -a nvidia-cuda-mps || echo none)"
}
has mps4 && drill 4
has mps8 && drill 8

if has twogpu; then
  "$BIN/hammer" --engine cuda --model "$MODEL" --worker-binary "$BIN/worker" --clips "$CLIPS" \
    --gpus 0,1 --instances-per-gpu 4 --concurrency 32 --duration-s "$DUR" \
    --kill-after-s $((DUR / 3)) --kill-group gpu0 --runtime-dir /tmp/fleet-2gpu 2>&1 \
    | tee "$OUT/twogpu.log" | grep -E '^\{' | cut -c1-1500
  sleep 2; echo "MPS processes after stop: $(pgrep -a nvidia-cuda-mps || echo none)"
fi

if has scaling; then
  for gpus in 0 0,1; do
    n=$(( $(echo "$gpus" | tr ',' '\n' | wc -l) * 32 ))
    "$BIN/hammer" --engine cuda --model "$MODEL" --worker-binary "$BIN/worker" --clips "$CLIPS" \
      --gpus "$gpus" --instances-per-gpu 4 --concurrency "$n" --duration-s 30 --skip-golden \
      --runtime-dir "/tmp/fleet-scale-${gpus/,/-}" 2>&1 | tee "$OUT/scaling-${gpus/,/-}.log" \
      | grep -E '"summary"' | python3 -c "import json,sys; s=json.loads(sys.stdin.read()); print('gpus $gpus: ok', s['ok'], 'failed', s['failed'], 'audio_s_per_s', round(s['audio_seconds_per_second']), 'p50_ms', round(s['latency_ms']['p50'],1))"
  done
fi

if has hammer; then
  diar=()
  [ -n "${DIAR_MODEL:-}" ] && diar=(--diar-model "$DIAR_MODEL" --diar-concurrency 8)
  "$BIN/hammer" --engine cuda --model "$MODEL" --worker-binary "$BIN/worker" --clips "$CLIPS" \
    --gpus 0 --instances-per-gpu 4 --concurrency 32 --duration-s "${HAMMER_S:-540}" "${diar[@]}" \
    --runtime-dir /tmp/fleet-hammer 2>&1 | tee "$OUT/hammer.log" | grep -E '^\{' | cut -c1-600
fi
