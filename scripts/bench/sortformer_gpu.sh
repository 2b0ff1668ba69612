#!/usr/bin/env bash
# Streaming Sortformer on the GPU machine (docs/benchmarks.md): the parity tests, then
# milliseconds per 15 s streaming step of the full-size random model, one instance alone and
# N instances (default 8) at PCT % (default 12) of the SMs under one MPS daemon, all at once.
# From the repository root, with the release test binaries copied to .device/
# (sortformer_parity, sortformer_bench). Logs under ${OUT:-/tmp/sortformer}.
set -uo pipefail
OUT=${OUT:-/tmp/sortformer}
MODEL=${MODEL:-/tmp/sortformer-full.nemo}
N=${N:-8}
PCT=${PCT:-12}
REC_S=${REC_S:-600}
BIN=$PWD/.device
mkdir -p "$OUT"
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv; } | tee "$OUT/gpu.txt"

REQUIRE_CUDA=1 "$BIN/sortformer_parity" --nocapture 2>&1 | grep -E 'RESULT|test result|panicked|FAILED' | tee "$OUT/parity.txt"

[ -f "$MODEL" ] || python3 scripts/make_full_size_sortformer.py --out "$MODEL" 2>&1 | tail -1
export SORTFORMER_BENCH_MODEL=$MODEL SORTFORMER_BENCH_SECONDS=$REC_S REQUIRE_CUDA=1

# One instance alone; sample its GPU memory while it runs.
"$BIN/sortformer_bench" --ignored --nocapture > "$OUT/single.txt" 2>&1 &
pid=$!
peak=0
while kill -0 $pid 2>/dev/null; do
  used=$(nvidia-smi --query-compute-apps=used_memory --format=csv,noheader,nounits | sort -n | tail -1)
  [ -n "$used" ] && [ "$used" -gt "$peak" ] && peak=$used
  sleep 0.5
done
wait $pid
grep RESULT "$OUT/single.txt"; echo "single instance peak GPU memory ${peak} MiB" | tee -a "$OUT/single.txt"

# N instances under one MPS daemon.
export CUDA_MPS_PIPE_DIRECTORY=/tmp/sortformer-mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/sortformer-mps/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d
for i in $(seq 1 "$N"); do
  CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$PCT "$BIN/sortformer_bench" --ignored --nocapture \
    > "$OUT/mps-$i.txt" 2>&1 &
done
wait
echo quit | nvidia-cuda-mps-control
grep -h RESULT "$OUT"/mps-*.txt
python3 - "$OUT" "$N" <<'PY'
import re, sys, glob
vals = [float(re.search(r"mean_ms=([\d.]+)", open(f).read()).group(1))
        for f in glob.glob(f"{sys.argv[1]}/mps-*.txt") if "RESULT" in open(f).read()]
print(f"MPS {len(vals)}/{sys.argv[2]} instances: mean of per-instance means {sum(vals)/max(len(vals),1):.2f} ms, worst {max(vals, default=0):.2f} ms")
PY
