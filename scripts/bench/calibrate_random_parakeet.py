#!/usr/bin/env python3
"""Make a random Parakeet `.nemo` (scripts/bench/make_random_parakeet.py) decode audio-dependent
tokens, so that token agreement between fp32 and bf16 measures real label decisions.

    python3 scripts/bench/calibrate_random_parakeet.py --model /tmp/parakeet-random.nemo \
        --out /tmp/parakeet-calibrated.nemo [--device cuda]

Why: with make_random_parakeet's N(0, 0.02) weights the encoder output hardly depends on the
audio (its variance over time is about 2 % of its mean square: the subsampling shrinks the
signal and near-uniform attention adds a per-clip constant in every layer), and the joint picks
one token with duration 1 at every frame (seen on CPU on 4 clips: one token id for 100 % of the
emissions, fp32 and bf16 alike). Token agreement on that output only measures duration ties.

What it changes (weights only; config and key names untouched, written the same way as
make_random_parakeet.py), using seeded synthetic calibration clips from make_clips.py:
- each subsampling layer's weight is rescaled so its output (bias excluded) has unit standard
  deviation on the calibration features (layer-sequential, LSUV-style);
- every attention output projection is scaled by --attention-out-gain (0.2): with random
  weights attention is nearly uniform, so each layer adds a per-clip constant that otherwise
  drowns the frame-dependent part of the encoder output (share of variance over time 0.02 -> 0.3);
- joint.enc and joint.pred weights are rescaled to output std 1.0 and --pred-std (0.1) on the
  calibration encoder frames / prediction outputs (a larger label-history weight lets the
  decoder lock into repeating one token with duration 0);
- the final joint Linear's bias centres every logit on the mean joint activation (so the
  argmax follows the input, not the shared mean; activations from calibration frames paired with
  prediction outputs of many labels), token and duration logits are scaled to unit std, blank
  gets the bias that makes it win on --blank-fraction (0.5) of those activations, and the
  duration biases are fitted so durations 0-4 win about 10/40/30/12/8 % of the time.
Prints how audio-dependent the encoder output is before and after (share of variance over time).
"""
import argparse
import collections
import io
import sys
import tarfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_clips  # noqa: E402
import pytorch_transcribe as pt  # noqa: E402

# How often each duration should win on the calibration joint inputs (durations 0..4).
DURATION_SHARE = [0.1, 0.4, 0.3, 0.12, 0.08]


def calibration_features(features: pt.Features, count: int, seconds: float, seed: int, device):
    gen = torch.Generator().manual_seed(seed)
    n = int(seconds * make_clips.SAMPLE_RATE)
    audio = torch.stack([make_clips.clip(gen, n) for _ in range(count)]).to(device)
    # Quantise like a 16-bit WAV would.
    audio = torch.round(audio * 32768).clamp(-32768, 32767) / 32768
    return features(audio, torch.full((count,), n, device=device))


def time_variance_share(x: torch.Tensor) -> float:
    """Variance over time (per clip and channel, averaged) as a share of the mean square."""
    return float(x.var(dim=1, unbiased=False).mean() / x.pow(2).mean().clamp(min=1e-30))


def rescale_subsampling(enc: pt.Encoder, feats, frames) -> None:
    sub = enc.pre_encode
    layers = [m for m in sub.conv if isinstance(m, torch.nn.Conv2d)] + [sub.out]
    for layer in layers:
        captured = {}
        handle = layer.register_forward_hook(lambda m, i, o: captured.__setitem__("out", o))
        sub(feats.transpose(1, 2), frames)
        handle.remove()
        out = captured["out"]
        bias = layer.bias if layer.bias is not None else torch.zeros(out.shape[1 if out.dim() == 4 else -1])
        centred = out - (bias.view(1, -1, 1, 1) if out.dim() == 4 else bias)
        layer.weight.mul_(1.0 / centred.std().clamp(min=1e-12))


def fit_final_joint(model: pt.Parakeet, enc_proj: torch.Tensor, pred_proj: torch.Tensor,
                    blank_fraction: float) -> None:
    """Centre, scale and bias the final joint Linear on joint activations of calibration frames
    paired with prediction outputs of many different labels."""
    gen = torch.Generator(device=enc_proj.device).manual_seed(0)
    pairs = 20000
    fi = torch.randint(0, enc_proj.shape[0], (pairs,), generator=gen, device=enc_proj.device)
    gi = torch.randint(0, pred_proj.shape[0], (pairs,), generator=gen, device=enc_proj.device)
    hidden = torch.relu(enc_proj[fi] + pred_proj[gi])
    final = model.joint.joint_net[-1]
    n_cls, blank = model.vocab + 1, model.blank
    final.bias.copy_(-final.weight @ hidden.mean(0))

    def logits():
        return hidden @ final.weight.T + final.bias

    for part in (slice(0, n_cls), slice(n_cls, None)):
        scale = 1.0 / logits()[:, part].std()
        final.weight[part].mul_(scale)
        final.bias[part].mul_(scale)
    out = logits()
    margin = out[:, :blank].max(-1).values - out[:, blank]
    final.bias[blank] += torch.quantile(margin.float(), blank_fraction)
    blank_share = float((logits()[:, :n_cls].argmax(-1) == blank).float().mean())
    # Duration biases: damped fixed-point iteration on the (small) duration-logit block.
    dur = out[:, n_cls:] - final.bias[n_cls:]
    n_dur = len(model.durations)
    target = torch.tensor(DURATION_SHARE[:n_dur], device=dur.device)
    target = target / target.sum()
    bias = torch.zeros(n_dur, device=dur.device)
    for _ in range(2000):
        share = torch.bincount((dur + bias).argmax(-1), minlength=n_dur).float() / pairs
        bias += 0.02 * (target.log() - share.clamp(min=1e-3).log()).clamp(-1, 1)
    final.bias[n_cls:] = bias
    share = torch.bincount((dur + bias).argmax(-1), minlength=n_dur).float() / pairs
    print(f"calibration joint: blank wins {blank_share:.2f}, duration shares {[round(float(x), 3) for x in share]}")

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--clips", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--seed", type=int, default=12345)
    ap.add_argument("--blank-fraction", type=float, default=0.5)
    ap.add_argument("--attention-out-gain", type=float, default=0.2,
                    help="factor on every attention output projection")
    ap.add_argument("--pred-std", type=float, default=0.1,
                    help="std of joint.pred's output relative to joint.enc's 1.0 (label history weight)")
    args = ap.parse_args()
    started = time.time()
    device = torch.device(args.device)
    with tarfile.open(args.model) as tar:
        config_bytes = next(tar.extractfile(m).read() for m in tar.getmembers()
                            if m.name.endswith("model_config.yaml"))
    cfg, sd = pt.load_nemo(args.model)
    features = pt.Features(cfg["preprocessor"], sd).to(device)
    model = pt.Parakeet(cfg, sd, use_sdpa=False)
    model.load_state_dict({k: v for k, v in sd.items() if not k.startswith("preprocessor.")}, strict=True)
    model = model.eval().to(device)
    with torch.inference_mode():
        feats, frames = calibration_features(features, args.clips, args.seconds, args.seed, device)
        f, _ = model.encoder(feats, frames)
        before = time_variance_share(f)
        rescale_subsampling(model.encoder, feats, frames)
        for layer in model.encoder.layers:
            layer.self_attn.linear_out.weight.mul_(args.attention_out_gain)
        f, _ = model.encoder(feats, frames)
        after = time_variance_share(f)
        joint, p = model.joint, model.decoder.prediction
        enc_proj = f @ joint.enc.weight.T
        joint.enc.weight.mul_(1.0 / enc_proj.std())
        # Prediction outputs for SOS and a spread of labels, from the zero state.
        labels = torch.arange(0, model.vocab + 1, 7, device=device)
        g, _ = p.dec_rnn.lstm(p.embed(labels)[:, None])
        pred_proj = g[:, 0] @ joint.pred.weight.T
        joint.pred.weight.mul_(args.pred_std / pred_proj.std())
        fit_final_joint(model, joint.enc(f).reshape(-1, joint.enc.out_features), joint.pred(g[:, 0]),
                        args.blank_fraction)
    out_sd = {k: v for k, v in sd.items() if k.startswith("preprocessor.")}
    out_sd.update({k: v.detach().cpu() for k, v in model.state_dict().items()})
    ordered = collections.OrderedDict((k, out_sd[k]) for k in sd)  # as make_random_parakeet saves it
    weights = io.BytesIO()
    torch.save(ordered, weights)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(args.out, "w:") as tar:
        for name, data in [("model_config.yaml", config_bytes), ("model_weights.ckpt", weights.getbuffer())]:
            info = tarfile.TarInfo(f"./{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    print(f"wrote {args.out} in {time.time() - started:.1f} s; encoder output variance over time: "
          f"{before:.3f} of the total before, {after:.3f} after")


if __name__ == "__main__":
    main()
