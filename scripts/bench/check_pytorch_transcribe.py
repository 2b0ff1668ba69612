#!/usr/bin/env python3
"""Checks scripts/bench/pytorch_transcribe.py (fp32) against the NeMo 3.0.0 outputs recorded in
models/tests/fixtures/tdt-real-options: for every fixture clip, decoded alone and all together in
one zero-padded batch, with manual and SDPA attention, the token ids, frames and durations must
equal NeMo's single-clip records; features and encoder outputs are compared with NeMo's
(relative L2, batch 1 and inside the batch). Exits non-zero on any token mismatch. Also shows
that the rel_pos_local_attn fixture is refused.

    /work/venvs/nemo/bin/python scripts/bench/check_pytorch_transcribe.py   # CPU is fine

Needs torch, PyYAML and safetensors (the NeMo venv has them); not NeMo itself.
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pytorch_transcribe as pt  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "models/tests/fixtures"


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-30))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixture", default="tdt-real-options")
    args = ap.parse_args()
    torch.set_num_threads(1)
    fixture = FIXTURES / args.fixture
    expected = json.loads((fixture / "expected.json").read_text())["clips"]
    tensors = load_file(str(fixture / "expected.safetensors"))
    names = sorted(expected)
    wavs = [FIXTURES / "clips" / f"{n}.wav" for n in names]
    failures = 0
    with torch.inference_mode():
        for attention in ("manual", "sdpa"):
            opts = argparse.Namespace(model=fixture / "model.nemo", attention=attention, dtype="fp32",
                                      decoder_dtype=None, no_cuda_graph=True, frame_bucket=1)
            tr = pt.Transcriber(opts, torch.device("cpu"))
            audio = [pt.read_wav(w, tr.features.sample_rate) for w in wavs]
            for batch_size in (1, len(names)):
                groups = [list(range(i, min(i + batch_size, len(names)))) for i in range(0, len(names), batch_size)]
                feat_err, enc_err = {}, {}
                hyps = {}
                for group in groups:
                    clips = [audio[i] for i in group]
                    samples = torch.tensor([len(c) for c in clips])
                    padded = torch.zeros(len(clips), int(samples.max()))
                    for j, c in enumerate(clips):
                        padded[j, : len(c)] = c
                    feats, frames = tr.features(padded, samples)
                    enc, enc_len = tr.model.encoder(feats, frames)
                    for j, i in enumerate(group):
                        n = names[i]
                        feat_err[n] = rel_l2(feats[j, :, : frames[j]], tensors[f"features/{n}"])
                        enc_err[n] = rel_l2(enc[j, : enc_len[j]].T, tensors[f"encoder/{n}"])
                    dec = pt.GreedyTdt(tr.model, enc.shape[0], enc.shape[1], torch.device("cpu"), False)
                    for i, hyp in zip(group, dec.decode(enc, enc_len)):
                        hyps[names[i]] = hyp
                for n in names:
                    tokens, frames_, durs = hyps[n]
                    e = expected[n]
                    same = (tokens == e["token_ids"], frames_ == e["token_frames"], durs == e["token_durations"])
                    failures += not all(same)
                    print(f"{attention:6} batch {batch_size}: {n:20} tokens {len(tokens):3} "
                          f"ids/frames/durations equal {same}  features rel L2 {feat_err[n]:.1e}  "
                          f"encoder rel L2 {enc_err[n]:.1e}")
    refused = subprocess.run(
        [sys.executable, str(Path(pt.__file__)), "--model", str(FIXTURES / "tdt-local-attn/model.nemo"),
         "--wav", str(wavs[0]), "--device", "cpu"], capture_output=True, text=True)
    print(f"tdt-local-attn: exit {refused.returncode}: {refused.stderr.strip().splitlines()[-1]}")
    failures += refused.returncode == 0
    print("OK" if failures == 0 else f"FAILED: {failures} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
