#!/usr/bin/env bash
# Makes the seed recordings of the pipeline benchmark (scripts/bench/pipeline_bench.sh) on the
# developer machine, where espeak-ng, sox and ffmpeg exist (the GPU machine has none of them):
# speech clips of 5, 15, 30, 45 and 60 s (the seed article's mix) encoded the ways recordings
# arrive, plus two long recordings. The GPU machine copies them many times over under new names.
#
#   ref16k/*.wav  16 kHz mono PCM16 (also the offline engine benchmark's input: the same audio)
#   seed/*.flac   16 kHz mono          seed/*.mp3       44.1 kHz stereo, 64 kb/s
#   seed/*.m4a    44.1 kHz stereo AAC, 64 kb/s          seed/*.opus.ogg  48 kHz Ogg Opus, 24 kb/s
#   long: 10 min mp3 (44.1 kHz mono, 32 kb/s) and 10 min Ogg Opus (48 kHz, 16 kb/s)
#
# Usage: bash scripts/bench/make_pipeline_corpus.sh [OUT_DIR] (default .bench-corpus, about
# 14 MB: small enough to carry to the GPU machine). Tools: espeak-ng, sox, ffmpeg (Debian 12).
set -euo pipefail
out=${1:-.bench-corpus}
rm -rf "$out"
mkdir -p "$out/seed" "$out/ref16k"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ff() { ffmpeg -hide_banner -loglevel error -y "$@"; }

sentences=(
  "The patient reports a mild headache since Tuesday and has been taking ibuprofen twice a day."
  "Blood pressure today is one hundred and thirty two over eighty four, which is slightly elevated."
  "We discussed the results of the scan, and there is no sign of any fracture in the left wrist."
  "She mentions that the cough gets worse at night and is sometimes accompanied by a low fever."
  "Please continue the current dose for two more weeks and then come back for a follow up visit."
  "The quarterly numbers show revenue growth of eleven percent, mostly driven by the new region."
  "Next, let us review the action items from last week and assign owners to the open questions."
)
for i in "${!sentences[@]}"; do
  espeak-ng -v en-us -s $((140 + i * 7)) -w "$tmp/raw$i.wav" "${sentences[$i]}"
  # Each sentence followed by 0.4 s of quiet, at 16 kHz mono (where the segmenter may cut).
  sox -R "$tmp/raw$i.wav" -r 16000 -c 1 -b 16 "$tmp/s$i.wav" pad 0 0.4
done

# speech SECONDS START OUT: sentences from START on, cycled, trimmed to SECONDS.
speech() {
  local seconds=$1 start=$2 dst=$3 parts=() total=0 i=$2
  while [ "$(echo "$total < $seconds" | bc)" = 1 ]; do
    parts+=("$tmp/s$((i % ${#sentences[@]})).wav")
    total=$(echo "$total + $(soxi -D "$tmp/s$((i % ${#sentences[@]})).wav")" | bc)
    i=$((i + 1))
  done
  sox -R "${parts[@]}" "$dst" trim 0 "$seconds"
}

n=0
for seconds in 5 15 30 45 60; do
  name="clip${seconds}s"
  src="$out/ref16k/$name.wav"
  speech "$seconds" $((n * 3)) "$src"
  ff -i "$src" -c:a flac "$out/seed/$name.flac"
  ff -i "$src" -ar 44100 -ac 2 -c:a libmp3lame -b:a 64k "$out/seed/$name.mp3"
  ff -i "$src" -ar 48000 -c:a libopus -b:a 24k "$out/seed/$name.opus.ogg"
  ff -i "$src" -ar 44100 -ac 2 -c:a aac -b:a 64k "$out/seed/$name.m4a"
  n=$((n + 1))
done

speech 600 2 "$tmp/long_a.wav"
ff -i "$tmp/long_a.wav" -ar 44100 -ac 1 -c:a libmp3lame -b:a 32k "$out/seed/long_10min.mp3"
speech 600 5 "$tmp/long_b.wav"
ff -i "$tmp/long_b.wav" -ar 48000 -c:a libopus -b:a 16k "$out/seed/long_10min.opus.ogg"
du -sh "$out"
