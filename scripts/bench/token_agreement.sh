#!/usr/bin/env bash
# Token agreement with fp32 and offline RTFx of plain PyTorch on the full-size random Parakeet
# checkpoint, optionally next to our engine. Runs from the repo root on the GPU machine with only
# python3 + torch + PyYAML:
#
#   OUT=/tmp/agree [CLIPS=100] [BATCHES="1 4 8 16 32 64"] [ENGINE_CMD='...'] \
#       bash scripts/bench/token_agreement.sh
#
# Steps: make_random_parakeet.py -> calibrate_random_parakeet.py (audio-dependent decoding, see
# its header) -> make_clips.py (CLIPS seeded clips of 5-60 s) -> pytorch_transcribe.py fp32
# (reference) and bf16 -> ENGINE_CMD if set -> token_agreement.py -> bf16 RTFx per batch size
# (length-sorted, warmed up). ENGINE_CMD runs under bash with MODEL, MANIFEST and ENGINE_OUT
# exported and must write JSON lines {"path": <manifest path>, "tokens": [...]} to $ENGINE_OUT.
# Our engine, e.g.: ENGINE_CMD='OFFLINE_MODEL=$MODEL OFFLINE_MANIFEST=$MANIFEST OFFLINE_OUT=$ENGINE_OUT
#   OFFLINE_BATCH=16 ./offline_bench --ignored --nocapture' (worker/cuda/tests/offline_bench.rs).
# Everything lands in $OUT: *.jsonl, agreement.md, rtfx.md, log.txt.
set -euo pipefail
OUT=${OUT:-/tmp/agree}
CLIPS=${CLIPS:-100}
BATCHES=${BATCHES:-1 4 8 16 32 64}
AGREE_BATCH=${AGREE_BATCH:-16}
HERE=scripts/bench
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1
date -u
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null || true
python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)'

RANDOM_NEMO=$OUT/parakeet-random.nemo
export MODEL=$OUT/parakeet-calibrated.nemo
export MANIFEST=$OUT/clips/manifest.jsonl
[ -f "$RANDOM_NEMO" ] || python3 $HERE/make_random_parakeet.py --out "$RANDOM_NEMO"
[ -f "$MODEL" ] || python3 $HERE/calibrate_random_parakeet.py --model "$RANDOM_NEMO" --out "$MODEL"
[ -f "$MANIFEST" ] || python3 $HERE/make_clips.py --out "$OUT/clips" --count "$CLIPS"

for dtype in fp32 bf16; do
  python3 $HERE/pytorch_transcribe.py --model "$MODEL" --manifest "$MANIFEST" --dtype $dtype \
    --batch-size "$AGREE_BATCH" --out "$OUT/pytorch_$dtype.jsonl" --summary "$OUT/pytorch_$dtype.summary.json"
done
files=("$OUT/pytorch_fp32.jsonl" "$OUT/pytorch_bf16.jsonl")
names="PyTorch fp32,PyTorch bf16"
if [ -n "${ENGINE_CMD:-}" ]; then
  export ENGINE_OUT=$OUT/engine.jsonl
  bash -c "$ENGINE_CMD"
  files+=("$ENGINE_OUT")
  names+=",ours"
fi
python3 $HERE/token_agreement.py "${files[@]}" --names "$names" | tee "$OUT/agreement.md"

echo "| batch | audio s | wall s | RTFx | features s | encoder s | decoder s |" > "$OUT/rtfx.md"
echo "|---|---|---|---|---|---|---|" >> "$OUT/rtfx.md"
for b in $BATCHES; do
  python3 $HERE/pytorch_transcribe.py --model "$MODEL" --manifest "$MANIFEST" --dtype bf16 \
    --batch-size "$b" --time --out "$OUT/rtfx_b$b.jsonl" --summary "$OUT/rtfx_b$b.json" || continue
  python3 -c 'import json,sys; print("| %(batch_size)s | %(audio_s)s | %(wall_s)s | %(rtfx)s | %(features_s)s | %(encoder_s)s | %(decoder_s)s |" % json.load(open(sys.argv[1])))' "$OUT/rtfx_b$b.json" >> "$OUT/rtfx.md"
done
echo "PyTorch bf16, offline, length-sorted, CUDA-graph decoder step:"
cat "$OUT/rtfx.md"
date -u
