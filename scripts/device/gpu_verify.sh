#!/usr/bin/env bash
# Everything the GPU machine must confirm for the CUDA engine and GPU diarization, in one device
# call (about 8 minutes on an H200), from the repository root. Built here first with
# scripts/device/build_device_bins.sh (the test binaries into .device/); carry [".device"], plus
# ".whl" (NeMo wheels) for the grid step: both together exceed the 64 MiB a call may carry, so
# carry only the binaries a call runs (e.g. ".device/encoder_bench"). Logs under
# ${OUT:-/tmp/verify}. Steps (STEPS=..., default all):
#   tests       every cuda-engine test binary with REQUIRE_CUDA=1 (kernel, encoder, decoder,
#               GPU-features and GPU-Sortformer parity, batch invariance)
#   sortformer  scripts/bench/sortformer_gpu.sh: ms per 15 s chunk, alone and 8 x 12 % under MPS
#   agreement   scripts/bench/token_agreement.sh with our engine (offline_bench) next to PyTorch
#               fp32/bf16 on 100 clips of 5-60 s; PyTorch bf16 RTFx per batch size
#   grid        scripts/bench/side_by_side.sh on the full encoder grid (1/4/16 x 5/15/30/45/60 s)
#   offline     offline RTFx of our engine on the agreement step's clips (made if missing) at
#               OFFLINE_BATCHES, GPU and host features, with the per-phase split
#   profile     ncu per-kernel GPU time of our encoder at 16 x 30 s (one forward pass)
set -uo pipefail
OUT=${OUT:-/tmp/verify}
STEPS=${STEPS:-tests sortformer agreement grid}
BIN=$PWD/.device
mkdir -p "$OUT"
has() { [[ " $STEPS " == *" $1 "* ]]; }
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv; } | tee "$OUT/gpu.txt"

if has tests; then
  for t in ${TESTS:-kernels encoder_kernels matmul_strides features_parity encoder_parity decoder_parity batch_invariance sortformer_parity}; do
    echo "== $t"
    REQUIRE_CUDA=1 timeout 300 "$BIN/$t" --nocapture > "$OUT/$t.log" 2>&1
    echo "exit $?"
    grep -E 'RESULT|test result|panicked|FAILED' "$OUT/$t.log" | cut -c1-200 | tail -40
  done
fi

if has sortformer; then
  OUT=$OUT/sortformer N=8 PCT=12 REC_S=${REC_S:-600} timeout 240 bash scripts/bench/sortformer_gpu.sh 2>&1 | tail -30
fi

if has agreement; then
  OUT=$OUT/agree ENGINE_CMD="OFFLINE_MODEL=\$MODEL OFFLINE_MANIFEST=\$MANIFEST OFFLINE_OUT=\$ENGINE_OUT \
OFFLINE_BATCH=16 REQUIRE_CUDA=1 $BIN/offline_bench --ignored --nocapture" \
    BATCHES=${BATCHES:-"4 16 64"} timeout 300 bash scripts/bench/token_agreement.sh 2>&1 \
    | grep -vE 'Warning' | tail -30
  # Our f32 encoder on the same clips, then all four against PyTorch fp32.
  A=$OUT/agree
  OFFLINE_MODEL=$A/parakeet-calibrated.nemo OFFLINE_MANIFEST=$A/clips/manifest.jsonl \
    OFFLINE_OUT=$A/engine_f32.jsonl OFFLINE_BATCH=16 OFFLINE_PRECISION=f32 REQUIRE_CUDA=1 \
    timeout 120 "$BIN/offline_bench" --ignored --nocapture 2>&1 | grep RESULT
  python3 scripts/bench/token_agreement.py "$A/pytorch_fp32.jsonl" "$A/pytorch_bf16.jsonl" \
    "$A/engine.jsonl" "$A/engine_f32.jsonl" --names "PyTorch fp32,PyTorch bf16,ours bf16,ours f32" \
    | tee "$A/agreement4.md"
fi

if has offline; then
  A=$OUT/agree
  mkdir -p "$A"
  [ -f "$A/parakeet-random.nemo" ] || python3 scripts/bench/make_random_parakeet.py --out "$A/parakeet-random.nemo" | tail -1
  [ -f "$A/parakeet-calibrated.nemo" ] || python3 scripts/bench/calibrate_random_parakeet.py \
    --model "$A/parakeet-random.nemo" --out "$A/parakeet-calibrated.nemo" | tail -1
  [ -f "$A/clips/manifest.jsonl" ] || python3 scripts/bench/make_clips.py --out "$A/clips" --count 100 | tail -1
  for run in ${OFFLINE_RUNS:-"16:device" "64:device" "16:host"}; do
    OFFLINE_MODEL=$A/parakeet-calibrated.nemo OFFLINE_MANIFEST=$A/clips/manifest.jsonl \
      OFFLINE_OUT=$A/offline_${run/:/_}.jsonl OFFLINE_BATCH=${run%%:*} OFFLINE_FEATURES=${run##*:} \
      REQUIRE_CUDA=1 timeout 120 "$BIN/offline_bench" --ignored --nocapture 2>&1 | grep RESULT
  done
  # PyTorch bf16 on the same clips in the same call (side by side), timed the same way.
  for b in ${PYTORCH_BATCHES:-16 64}; do
    python3 scripts/bench/pytorch_transcribe.py --model "$A/parakeet-calibrated.nemo" \
      --manifest "$A/clips/manifest.jsonl" --dtype bf16 --batch-size "$b" --time \
      --out "$A/pytorch_rtfx_b$b.jsonl" --summary "$A/pytorch_rtfx_b$b.json" 2>&1 | grep RESULT
  done
fi

if has profile; then
  ENCODER_BENCH_SHAPES=16x30 REQUIRE_CUDA=1 timeout 240 ncu --clock-control none \
    --metrics gpu__time_duration.sum --launch-skip ${NCU_SKIP:-2500} --launch-count ${NCU_COUNT:-700} \
    --csv --print-summary per-kernel "$BIN/encoder_bench" --ignored --nocapture \
    > "$OUT/ncu_encoder.csv" 2> "$OUT/ncu_encoder.err"
  echo "ncu exit $?"
  python3 scripts/bench/ncu_summary.py "$OUT/ncu_encoder.csv" | tee "$OUT/ncu_encoder.md"
fi

if has grid; then
  OUT=$OUT/grid SHAPES=1x5,1x15,1x30,1x45,1x60,4x5,4x15,4x30,4x45,4x60,16x5,16x15,16x30,16x45,16x60 \
    timeout 300 bash scripts/bench/side_by_side.sh 2>&1 | tail -25
fi
date -u
