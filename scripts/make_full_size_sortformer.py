"""Write a full-size Streaming Sortformer 4spk v2 architecture .nemo with seeded random weights.

    python scripts/make_full_size_sortformer.py --out PATH.nemo [--seed N] [--with-nemo]

FastConformer 17 x 512 (dw_striding x8, 256 channels, conv kernel 9), 18-layer post-LN
transformer of width 192 (inner 768, 8 heads), 4 speakers, streaming preset chunk 188 / FIFO 188
/ cache 188 frames (sortformer_config.FULL_SIZE_V2). For loading and speed work only: the
weights are random, so the probabilities mean nothing. Made on demand, never checked in (~0.5 GB).

Needs only torch, numpy and pyyaml: the state dict is written with NeMo's key names and
shapes directly (the same keys NeMo 3.0.0 saves for SortformerEncLabelModel; the checked-in
tiny fixture was built by NeMo itself and has them). With --with-nemo, NeMo builds and saves
the model instead.
"""

from __future__ import annotations

import argparse
import io
import math
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))

from sortformer_config import FULL_SIZE_V2, SortformerSpec, sortformer_config  # noqa: E402


def slaney_filterbank(sr: int, n_fft: int, n_mels: int) -> np.ndarray:
    """librosa.filters.mel(sr, n_fft, n_mels, htk=False, norm='slaney'), [n_mels, n_fft/2+1]."""

    def hz_to_mel(f):
        f = np.asarray(f, dtype=np.float64)
        lin = f / (200.0 / 3)
        log = 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) / (np.log(6.4) / 27.0)
        return np.where(f >= 1000.0, log, lin)

    def mel_to_hz(m):
        m = np.asarray(m, dtype=np.float64)
        lin = m * (200.0 / 3)
        log = 1000.0 * np.exp((np.log(6.4) / 27.0) * (m - 15.0))
        return np.where(m >= 15.0, log, lin)

    fft_freqs = np.linspace(0, sr / 2, n_fft // 2 + 1)
    mel_f = mel_to_hz(np.linspace(hz_to_mel(0.0), hz_to_mel(sr / 2), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_f[2 : n_mels + 2] - mel_f[:n_mels]))[:, None]
    return weights.astype(np.float32)


def random_state_dict(spec: SortformerSpec, seed: int) -> dict[str, torch.Tensor]:
    """NeMo's SortformerEncLabelModel keys, PyTorch-default-like initialisation."""
    gen = torch.Generator().manual_seed(seed)
    sd: dict[str, torch.Tensor] = {}

    def uniform(shape, fan_in):
        bound = 1.0 / math.sqrt(fan_in)
        return (torch.rand(shape, generator=gen) * 2 - 1) * bound

    def linear(prefix, n_in, n_out, conv1d=False, bias=True):
        shape = (n_out, n_in, 1) if conv1d else (n_out, n_in)
        sd[f"{prefix}.weight"] = uniform(shape, n_in)
        if bias:
            sd[f"{prefix}.bias"] = uniform((n_out,), n_in)

    def norm(prefix, n):
        sd[f"{prefix}.weight"] = torch.ones(n)
        sd[f"{prefix}.bias"] = torch.zeros(n)

    sd["preprocessor.featurizer.window"] = torch.hann_window(400, periodic=False)
    sd["preprocessor.featurizer.fb"] = torch.from_numpy(slaney_filterbank(16000, 512, spec.n_mels)).unsqueeze(0)

    d, c = spec.fc_d_model, spec.subsampling_conv_channels
    p = "encoder.pre_encode"
    sd[f"{p}.conv.0.weight"] = uniform((c, 1, 3, 3), 9)
    sd[f"{p}.conv.0.bias"] = uniform((c,), 9)
    for dw, pw in ((2, 3), (5, 6)):
        sd[f"{p}.conv.{dw}.weight"] = uniform((c, 1, 3, 3), 9)
        sd[f"{p}.conv.{dw}.bias"] = uniform((c,), 9)
        sd[f"{p}.conv.{pw}.weight"] = uniform((c, c, 1, 1), c)
        sd[f"{p}.conv.{pw}.bias"] = uniform((c,), c)
    freq = spec.n_mels
    for _ in range(3):
        freq = (freq - 1) // 2 + 1
    linear(f"{p}.out", c * freq, d)

    ff = d * spec.ff_expansion_factor
    dk = d // spec.fc_heads
    for layer in range(spec.fc_layers):
        e = f"encoder.layers.{layer}"
        for ffn in ("feed_forward1", "feed_forward2"):
            norm(f"{e}.norm_{ffn}", d)
            linear(f"{e}.{ffn}.linear1", d, ff)
            linear(f"{e}.{ffn}.linear2", ff, d)
        norm(f"{e}.norm_conv", d)
        linear(f"{e}.conv.pointwise_conv1", d, 2 * d, conv1d=True)
        sd[f"{e}.conv.depthwise_conv.weight"] = uniform((d, 1, spec.conv_kernel_size), spec.conv_kernel_size)
        sd[f"{e}.conv.depthwise_conv.bias"] = uniform((d,), spec.conv_kernel_size)
        norm(f"{e}.conv.batch_norm", d)
        sd[f"{e}.conv.batch_norm.running_mean"] = torch.zeros(d)
        sd[f"{e}.conv.batch_norm.running_var"] = torch.ones(d)
        sd[f"{e}.conv.batch_norm.num_batches_tracked"] = torch.tensor(0, dtype=torch.int64)
        linear(f"{e}.conv.pointwise_conv2", d, d, conv1d=True)
        norm(f"{e}.norm_self_att", d)
        sd[f"{e}.self_attn.pos_bias_u"] = torch.randn((spec.fc_heads, dk), generator=gen) * 0.02
        sd[f"{e}.self_attn.pos_bias_v"] = torch.randn((spec.fc_heads, dk), generator=gen) * 0.02
        for name in ("linear_q", "linear_k", "linear_v", "linear_out"):
            linear(f"{e}.self_attn.{name}", d, d)
        linear(f"{e}.self_attn.linear_pos", d, d, bias=False)
        norm(f"{e}.norm_out", d)

    h = spec.tf_d_model
    for layer in range(spec.tf_layers):
        t = f"transformer_encoder.layers.{layer}"
        norm(f"{t}.layer_norm_1", h)
        for name in ("query_net", "key_net", "value_net", "out_projection"):
            linear(f"{t}.first_sub_layer.{name}", h, h)
        norm(f"{t}.layer_norm_2", h)
        linear(f"{t}.second_sub_layer.dense_in", h, spec.tf_inner)
        linear(f"{t}.second_sub_layer.dense_out", spec.tf_inner, h)

    m = "sortformer_modules"
    linear(f"{m}.hidden_to_spks", 2 * h, spec.num_spks)
    linear(f"{m}.first_hidden_to_hidden", h, h)
    linear(f"{m}.single_hidden_to_spks", h, spec.num_spks)
    if d != h:
        linear(f"{m}.encoder_proj", d, h)
    return sd


def write_nemo(out: Path, config: dict, state_dict: dict[str, torch.Tensor]) -> None:
    weights = io.BytesIO()
    torch.save(state_dict, weights)
    members = [
        ("./model_config.yaml", yaml.safe_dump(config, sort_keys=False).encode()),
        ("./model_weights.ckpt", weights.getvalue()),
    ]
    with tarfile.open(out, "w:") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))


def with_nemo(out: Path, seed: int) -> None:
    from nemo.collections.asr.models import SortformerEncLabelModel
    from omegaconf import OmegaConf

    torch.manual_seed(seed)
    model = SortformerEncLabelModel(cfg=OmegaConf.create(sortformer_config(FULL_SIZE_V2))).eval()
    model.save_to(str(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path, help="where to write the .nemo")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--nemo-version", default="3.0.0", help="recorded in the config (decides STFT padding)")
    parser.add_argument("--with-nemo", action="store_true", help="build and save with NeMo instead of plain torch")
    args = parser.parse_args()
    started = time.time()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.with_nemo:
        with_nemo(args.out, args.seed)
    else:
        config = {**sortformer_config(FULL_SIZE_V2), "nemo_version": args.nemo_version}
        state_dict = random_state_dict(FULL_SIZE_V2, args.seed)
        write_nemo(args.out, config, state_dict)
        n_params = sum(t.numel() for t in state_dict.values() if t.dtype.is_floating_point)
        print(f"{n_params / 1e6:.1f}M float parameters")
    print(f"wrote {args.out}: {args.out.stat().st_size / 1e9:.2f} GB in {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
