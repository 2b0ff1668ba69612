"""Encoder throughput of the PyTorch way: NeMo's own ConformerEncoder, eager, bf16.

Parakeet TDT 0.6B v2 encoder shapes (24 layers, d_model 1024, 8 heads, ff 4096, 128 mels,
dw_striding x8 with 256 channels, conv kernel 9, xscaling off, no biases), random seeded weights
(NeMo's default init), random features [B, 128, 100*seconds], all lengths full.

Modes:
  bf16      module cast with .to(torch.bfloat16), bf16 input (everything in bf16)
  autocast  fp32 module, torch.autocast('cuda', bfloat16) (how NeMo's own AMP inference runs)
each with NeMo's manual attention (use_pytorch_sdpa=False, the released Parakeet config) and
optionally with torch SDPA. torch.inference_mode(), no torch.compile. CUDA-event timing, warm-ups,
median of the repeats. Prints one `RESULT` line per (mode, shape).

Usage: python3 pytorch_encoder.py --shapes 1x30,4x30,16x30,16x60 [--modes bf16,autocast] [--sdpa]
"""

import argparse
import contextlib
import statistics

import torch


def build_encoder(use_sdpa: bool) -> torch.nn.Module:
    from nemo.collections.asr.modules import ConformerEncoder

    return ConformerEncoder(
        feat_in=128,
        n_layers=24,
        d_model=1024,
        subsampling="dw_striding",
        subsampling_factor=8,
        subsampling_conv_channels=256,
        ff_expansion_factor=4,
        self_attention_model="rel_pos",
        n_heads=8,
        att_context_size=[-1, -1],
        xscaling=False,
        untie_biases=True,
        pos_emb_max_len=5000,
        conv_kernel_size=9,
        conv_norm_type="batch_norm",
        use_bias=False,
        dropout=0.1,
        dropout_pre_encoder=0.1,
        dropout_emb=0.0,
        dropout_att=0.1,
        use_pytorch_sdpa=use_sdpa,
    )


def time_encoder(enc, batch, seconds, dtype, autocast, warmup, repeats):
    frames = seconds * 100
    gen = torch.Generator(device="cuda").manual_seed(1234 + batch * 1000 + seconds)
    feats = torch.randn(batch, 128, frames, device="cuda", generator=gen, dtype=torch.float32).to(dtype)
    lengths = torch.full((batch,), frames, dtype=torch.int64, device="cuda")
    ctx = torch.autocast("cuda", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    torch.cuda.reset_peak_memory_stats()
    with torch.inference_mode(), ctx:
        for _ in range(warmup):
            out, out_len = enc(audio_signal=feats, length=lengths)
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out, out_len = enc(audio_signal=feats, length=lengths)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    finite = bool(torch.isfinite(out).all())
    return times, finite, tuple(out.shape), out.dtype, torch.cuda.max_memory_allocated() / 2**30


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1x30,4x30,16x30")
    ap.add_argument("--modes", default="bf16,autocast")
    ap.add_argument("--sdpa", action="store_true", help="also time with use_pytorch_sdpa=True")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]

    import nemo

    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), nemo {nemo.__version__}, "
          f"GPU {torch.cuda.get_device_name(0)}", flush=True)
    torch.manual_seed(0)
    with torch.device("cuda"):
        enc32 = build_encoder(use_sdpa=False).eval()
    # pos_bias_u/v are made with torch.FloatTensor, which ignores the device context.
    enc32 = enc32.cuda()
    print(f"parameters: {sum(p.numel() for p in enc32.parameters()) / 1e6:.1f} M", flush=True)
    variants = [False, True] if args.sdpa else [False]
    for use_sdpa in variants:
        # The flag is read at forward time by every attention module; switch it in place so
        # both variants share the same weights.
        for m in enc32.modules():
            if hasattr(m, "use_pytorch_sdpa"):
                m.use_pytorch_sdpa = use_sdpa
        for mode in args.modes.split(","):
            if mode == "bf16":
                enc, dtype, autocast = enc32.to(torch.bfloat16), torch.bfloat16, False
            elif mode == "autocast":
                enc, dtype, autocast = enc32.to(torch.float32), torch.float32, True
            else:
                raise SystemExit(f"unknown mode {mode}")
            for batch, seconds in shapes:
                times, finite, shape, odt, mem = time_encoder(
                    enc, batch, seconds, dtype, autocast, args.warmup, args.repeats)
                med = statistics.median(times)
                print(f"RESULT pytorch mode={mode} sdpa={use_sdpa} batch={batch} x {seconds} s: "
                      f"median {med:.2f} ms (min {min(times):.2f}, max {max(times):.2f}) = "
                      f"{batch * seconds / (med / 1e3):.0f} audio-s per GPU-s; out {shape} {odt}; "
                      f"finite {finite}; peak alloc {mem:.2f} GiB", flush=True)


if __name__ == "__main__":
    main()
