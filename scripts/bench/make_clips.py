#!/usr/bin/env python3
"""Seeded random speech-like clips for the token-agreement and RTFx runs (torch only, no numpy).

    python3 scripts/bench/make_clips.py --out /tmp/clips [--count 100] [--seed 0] \
        [--min-seconds 5] [--max-seconds 60]

Writes clip_000.wav ... (16 kHz mono 16-bit PCM) and manifest.jsonl ({"path": "/abs/clip_000.wav",
"seconds": 12.3456} per line; absolute paths, as worker/cuda/tests/offline_bench.rs opens them
as given; --relative-paths writes them relative to the manifest) into --out. Lengths are uniform in
[min, max] seconds, rounded to whole samples. Each clip is a voiced part (a low-passed sawtooth on a
gliding pitch of 90-240 Hz) plus band-limited noise (a random band inside 100-7000 Hz), both
under a syllable-rate envelope (3-7 Hz) gated into words and pauses, at a random level of
-35..-12 dBFS RMS. The same arguments give the same bytes on any machine (float32 arithmetic in
torch on CPU; tested on one machine only).
"""
import argparse
import array
import json
import math
import sys
import wave
from pathlib import Path

import torch

SAMPLE_RATE = 16000


def uniform(gen: torch.Generator, lo: float, hi: float) -> float:
    return lo + (hi - lo) * float(torch.rand((), generator=gen, dtype=torch.float64))


def smooth_random(gen: torch.Generator, n: int, rate_hz: float) -> torch.Tensor:
    """Random values at `rate_hz` linearly interpolated to n samples, in [0, 1]."""
    points = max(2, int(n / SAMPLE_RATE * rate_hz) + 2)
    knots = torch.rand(1, 1, points, generator=gen)
    return torch.nn.functional.interpolate(knots, size=n, mode="linear", align_corners=True)[0, 0]


def word_gate(gen: torch.Generator, n: int) -> torch.Tensor:
    """1 inside words (0.2-1.2 s), 0 in pauses (0.05-0.6 s), with 10 ms ramps."""
    gate = torch.zeros(n)
    pos = int(uniform(gen, 0.0, 0.5) * SAMPLE_RATE)
    while pos < n:
        length = int(uniform(gen, 0.2, 1.2) * SAMPLE_RATE)
        gate[pos: pos + length] = 1.0
        pos += length + int(uniform(gen, 0.05, 0.6) * SAMPLE_RATE)
    # 10 ms moving average (running sums in float64 keep it exact enough).
    sums = torch.cat([torch.zeros(160, dtype=torch.float64), torch.cumsum(gate.double(), 0)])
    return ((sums[160:] - sums[:-160]) / 160).float()


def clip(gen: torch.Generator, n: int) -> torch.Tensor:
    # Voiced part: a sawtooth on a gliding pitch (all harmonics, 1/k amplitudes), low-passed.
    pitch = uniform(gen, 90, 160) * (1 + 0.5 * smooth_random(gen, n, 2.0))
    phase = torch.remainder(torch.cumsum(2 * math.pi * pitch.double() / SAMPLE_RATE, 0), 2 * math.pi)
    freqs = torch.fft.rfftfreq(n, 1 / SAMPLE_RATE)
    voiced = torch.fft.irfft(torch.fft.rfft((math.pi - phase.float()) / 2) * (freqs <= 7000), n)
    # Unvoiced part: white noise band-passed in the frequency domain.
    noise = torch.randn(n, generator=gen)
    spec = torch.fft.rfft(noise)
    lo = uniform(gen, 100, 2000)
    hi = uniform(gen, lo + 500, 7000)
    spec = spec * ((freqs >= lo) & (freqs <= hi))
    unvoiced = torch.fft.irfft(spec, n)
    unvoiced = unvoiced / unvoiced.std().clamp(min=1e-9)
    voicing = smooth_random(gen, n, 4.0)
    syllables = 0.5 - 0.5 * torch.cos(torch.cumsum(2 * math.pi * uniform(gen, 3, 7) / SAMPLE_RATE
                                                   * (0.7 + 0.6 * smooth_random(gen, n, 1.0)), 0))
    signal = (voicing * voiced / voiced.std().clamp(min=1e-9) + (1 - voicing) * unvoiced)
    signal = signal * syllables * word_gate(gen, n)
    rms = float(signal.pow(2).mean().sqrt().clamp(min=1e-9))
    level = 10 ** (uniform(gen, -35, -12) / 20)
    return (signal * (level / rms)).clamp(-1, 32767 / 32768)


def write_wav(path: Path, samples: torch.Tensor) -> None:
    pcm = array.array("h", torch.round(samples * 32768).to(torch.int16).tolist())
    if sys.byteorder == "big":
        pcm.byteswap()  # WAV is little-endian
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(pcm.tobytes())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min-seconds", type=float, default=5.0)
    ap.add_argument("--max-seconds", type=float, default=60.0)
    ap.add_argument("--relative-paths", action="store_true",
                    help="manifest paths relative to the manifest's directory (default: absolute)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(args.seed)
    total = 0.0
    with open(args.out / "manifest.jsonl", "w") as manifest:
        for i in range(args.count):
            n = int(round(uniform(gen, args.min_seconds, args.max_seconds) * SAMPLE_RATE))
            name = f"clip_{i:03d}.wav"
            write_wav(args.out / name, clip(gen, n))
            path = name if args.relative_paths else str((args.out / name).resolve())
            manifest.write(json.dumps({"path": path, "seconds": n / SAMPLE_RATE}) + "\n")
            total += n / SAMPLE_RATE
    print(f"wrote {args.count} clips, {total:.1f} s of audio, to {args.out}")


if __name__ == "__main__":
    main()
