#!/usr/bin/env bash
# A 10-hour recording through the main job on the GPU (issue 30, long jobs): `dispatcher local
# --gpus 0` at its defaults (24-minute segments, hour-long checkpoints), killed (SIGKILL, the
# whole process group) once it has saved its first checkpoint, then run again; the resumed
# result must equal an uninterrupted run's, byte for byte.
# From the repository root on the GPU machine, with .device-pipeline/bins.tar.xz
# (scripts/bench/build_pipeline_bins.sh) and .bench-corpus/ (scripts/bench/make_pipeline_corpus.sh).
#   HOURS (default 10), OUT (default /tmp/long-recording)
set -uo pipefail
OUT=${OUT:-/tmp/long-recording}
BIN=${BIN:-/tmp/pipeline-bin}
MODEL=${MODEL:-/tmp/parakeet-random.nemo}
HOURS=${HOURS:-10}
mkdir -p "$OUT"
OUT=$OUT/prep STEPS="model" BIN=$BIN MODEL=$MODEL bash scripts/bench/pipeline_bench.sh \
  > "$OUT/prep.log" 2>&1
export LD_LIBRARY_PATH="$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# The recording: the 16 kHz reference clips, one after another, until HOURS of audio.
rm -rf /tmp/long-in && mkdir -p /tmp/long-in
python3 - "$HOURS" <<'EOF'
import glob, sys, wave
hours = float(sys.argv[1])
clips = []
for path in sorted(glob.glob(".bench-corpus/ref16k/*.wav")):
    with wave.open(path) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (16000, 1, 2)
        clips.append(w.readframes(w.getnframes()))
target = int(hours * 3600 * 16000) * 2
with wave.open("/tmp/long-in/ten_hours.wav", "wb") as out:
    out.setnchannels(1); out.setsampwidth(2); out.setframerate(16000)
    written, i = 0, 0
    while written < target:
        piece = clips[i % len(clips)][: target - written]
        out.writeframes(piece)
        written += len(piece); i += 1
print(f"recording: {written / 32000 / 3600:.2f} h, {written / 1e9:.2f} GB")
EOF

# One `dispatcher local` run over /tmp/long-in into store $1, in its own process group; its
# pid in $pid.
run() {
  local store=$1 log=$2
  RUST_LOG=info,dispatcher::checkpoint=debug setsid "$BIN/dispatcher" local \
    --spool "/tmp/long-spool-$store" --store "/tmp/long-store-$store" --input-dir /tmp/long-in \
    --model "$MODEL" --gpus 0 --runtime-dir "/tmp/long-fleet-$store" --progress-interval-s 10 \
    > "$log" 2>&1 &
  pid=$!
}
rm -rf /tmp/long-spool-* /tmp/long-store-* /tmp/long-fleet-*
# Seconds since $1 (a `date +%s.%N`).
since() { awk -v s="$1" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }'; }

start=$(date +%s.%N)
run resumed "$OUT/first.log"
for _ in $(seq 1200); do
  grep -q "checkpoint saved" "$OUT/first.log" && break
  sleep 0.1
done
kill -KILL -- "-$pid"
pkill -KILL -x worker  # the whole node is lost, its workers too
echo "$(date -u +%T) killed after $(since "$start") s: $(grep -c 'checkpoint saved' "$OUT/first.log") checkpoint(s) saved"
sleep 2
start=$(date +%s.%N)
run resumed "$OUT/second.log"
wait "$pid"; rc=$?
echo "second run: exit $rc after $(since "$start") s"
start=$(date +%s.%N)
run whole "$OUT/whole.log"
wait "$pid"; rc2=$?
echo "uninterrupted run: exit $rc2 after $(since "$start") s"

for log in first second whole; do
  sed -i 's/\x1b\[[0-9;]*m//g' "$OUT/$log.log"
  echo "== $log: $(grep -c 'checkpoint saved' "$OUT/$log.log") saved, $(grep -c 'checkpoint loaded' "$OUT/$log.log") loaded"
  grep -E 'resumed after|worker ready|^done [0-9]+ ·' "$OUT/$log.log" | cut -c1-220 | head -5
done
a=$(find /tmp/long-store-resumed -name transcript.verbose.json)
b=$(find /tmp/long-store-whole -name transcript.verbose.json)
ls -la "$a" "$b"
if cmp -s "$a" "$b"; then echo "verbose json: identical"; else echo "verbose json: DIFFERENT"; fi
for f in transcript.srt transcript.txt; do
  cmp -s "$(dirname "$a")/$f" "$(dirname "$b")/$f" && echo "$f: identical" || echo "$f: DIFFERENT"
done
python3 - "$a" <<'EOF'
import json, sys
v = json.load(open(sys.argv[1]))
w = v["words"]
print(f"duration {v['duration']} s, {len(v['segments'])} segments, {len(w)} words, "
      f"last word ends {w[-1]['end']} s, words in order: {all(a['start'] <= b['start'] for a, b in zip(w, w[1:]))}")
EOF
find "$(dirname "$a")" -maxdepth 1 -type f | sort | head -30
