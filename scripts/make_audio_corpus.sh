#!/usr/bin/env bash
# Rebuilds the checked-in audio test corpus under dispatcher/audio/tests/data/.
# The files are committed, so tests and CI never need these tools; this script records exactly
# how each one was made. Tools: espeak-ng 1.51, sox 14.4.2, ffmpeg 5.1 (Debian 12), python3.
# Usage: scripts/make_audio_corpus.sh   (from the repository root)
set -euo pipefail

out="dispatcher/audio/tests/data"
mkdir -p "$out"
cd "$out"
ff() { ffmpeg -hide_banner -loglevel error -y "$@"; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# ── Good files: one 3.x s espeak-ng sentence, then the same speech in every supported format ──
espeak-ng -v en-us -s 150 -w "$tmp/espeak.wav" "The patient reports a mild headache since Tuesday."
# espeak-ng writes 22.05 kHz; the reference is PCM16 16 kHz mono.
sox -R "$tmp/espeak.wav" -r 16000 -c 1 -b 16 speech_16k_mono.wav

# 1 kHz / 440 Hz stereo tone at 44.1 kHz (1 s): the resampling + downmix path.
sox -R -n -r 44100 -b 16 tone_44k1_stereo.wav synth 1 sine 1000 sine 440 channels 2 gain -6 remix 1 2

ff -i speech_16k_mono.wav -c:a flac speech.flac
ff -i speech_16k_mono.wav -ar 44100 -ac 2 -c:a libmp3lame -b:a 64k speech.mp3
ff -i speech_16k_mono.wav -ar 44100 -ac 2 -c:a aac -b:a 64k speech.m4a
ff -i speech_16k_mono.wav -ar 44100 -c:a libvorbis -q:a 2 speech.ogg
ff -i speech_16k_mono.wav -c:a libopus -b:a 24k speech.opus.ogg
ff -i speech_16k_mono.wav -c:a libopus -b:a 24k speech.webm
# Stereo Opus: libopus itself decodes it to 16 kHz mono.
ff -i tone_44k1_stereo.wav -c:a libopus -b:a 64k -ac 2 tone_stereo.opus.ogg
# IMA ADPCM in WAV (symphonia decodes it; proves the "odd WAV codec" path is not a failure).
sox -R speech_16k_mono.wav -e ima-adpcm speech_ima_adpcm.wav
# MP3 and MP2 inside WAVE (format tags 0x0055 and 0x0050, as phones and dictation systems write
# them): symphonia's WAV reader refuses both tags, the crate demuxes the data chunk itself.
ff -i speech_16k_mono.wav -ar 44100 -ac 1 -c:a libmp3lame -b:a 32k -f wav speech_mp3.wav
ff -i speech_16k_mono.wav -ar 44100 -ac 1 -c:a mp2 -b:a 32k -f wav speech_mp2.wav

# ── Bad / edge set ──
: > empty.wav                                                   # 0 bytes
size=$(stat -c %s speech_16k_mono.wav); head -c $((size / 2)) speech_16k_mono.wav > truncated.wav
size=$(stat -c %s speech.mp3); head -c $((size / 2)) speech.mp3 > truncated.mp3
cp speech.mp3 mp3_named.wav                                     # wrong extension
python3 - <<'EOF'
import random
random.seed(20261130)
open("random.bin", "wb").write(bytes(random.getrandbits(8) for _ in range(8192)))
# MP3 with 2 KiB of garbage written over its middle: a few corrupt frames, the rest fine.
data = bytearray(open("speech.mp3", "rb").read())
mid = len(data) // 2
data[mid:mid + 2048] = bytes(random.getrandbits(8) for _ in range(2048))
open("corrupt_middle.mp3", "wb").write(bytes(data))
EOF
printf 'This is a text file, not audio.\n%.0s' {1..20} > text_named.mp3
sox -R speech_16k_mono.wav -r 8000 -e gsm-full-rate gsm.wav    # WAV with GSM 6.10: no decoder
ff -i speech_16k_mono.wav -c:a ac3 -b:a 64k ac3.mka            # Matroska with AC-3: no decoder
sox -R -n -r 16000 -b 16 -c 1 clip_160ms.wav synth 0.160 sine 300 gain -6
sox -R -n -r 16000 -b 16 -c 1 clip_100ms.wav synth 0.100 sine 300 gain -6
sox -R -D -n -r 16000 -b 16 -c 1 silence_2s.wav trim 0 2         # -D: no dither, true zeros
sox -R speech_16k_mono.wav -r 8000 rate_8k.wav
sox -R -n -r 96000 -b 16 -c 1 rate_96k.wav synth 0.5 sine 1000 gain -6
sox -R -n -r 4000 -b 16 -c 1 rate_4k.wav synth 0.5 sine 500 gain -6
sox -R -n -r 16000 -b 16 -c 8 channels_8.wav synth 0.5 sine 300 gain -6
# Microphone arrays, 8 kHz to stay small: 32 channels as sox writes them (WAVE_FORMAT_EXTENSIBLE,
# no channel mask) and 33 (one over the default limit) as ffmpeg writes them (plain PCM).
sox -R -n -r 8000 -b 16 -c 32 channels_32.wav synth 0.3 sine 300 gain -6
sox -R -n -r 8000 -b 16 -c 33 "$tmp/channels_33.wav" synth 0.2 sine 300 gain -6
ff -i "$tmp/channels_33.wav" -c:a pcm_s16le channels_33.wav

# WAV headers that lie about the data length (44-byte canonical header: RIFF size at offset 4,
# data size at offset 40).
python3 - <<'EOF'
import struct
src = open("speech_16k_mono.wav", "rb").read()
assert src[36:40] == b"data", "expected a canonical 44-byte WAV header"
data_len = struct.unpack("<I", src[40:44])[0]
def with_sizes(riff, data):
    return src[:4] + struct.pack("<I", riff) + src[8:40] + struct.pack("<I", data) + src[44:]
# RIFF and data sizes agree, but claim twice the samples the file holds (a cut upload).
open("lying_header_long.wav", "wb").write(with_sizes(36 + 2 * data_len, 2 * data_len))
# Sizes agree and claim ~4 GiB (37 h at 16 kHz): a decoder bomb if anyone allocates from them.
huge = 0xFFFFFFF0
open("lying_header_huge.wav", "wb").write(with_sizes(huge, huge - 36))
# The data chunk claims more than its parent RIFF chunk: structurally inconsistent.
open("lying_header_inconsistent.wav", "wb").write(with_sizes(36 + data_len, 2 * data_len))
# 0xFFFFFFFF sizes are what streaming writers (ffmpeg to a pipe) leave: length unknown, not a lie.
open("streaming_header.wav", "wb").write(with_sizes(0xFFFFFFFF, 0xFFFFFFFF))
EOF

ls -l
du -sh .
