#!/usr/bin/env python3
"""Parakeet TDT transcription in plain PyTorch (torch + PyYAML only, no NeMo), read from a `.nemo`:
the reference "PyTorch user" side of the CUDA engine's token-agreement and RTFx measurements.

    python3 scripts/bench/pytorch_transcribe.py --model /tmp/parakeet-random.nemo \
        --manifest /tmp/clips/manifest.jsonl --dtype fp32 --batch-size 16 --out /tmp/fp32.jsonl
    python3 scripts/bench/pytorch_transcribe.py --model ... --manifest ... --dtype bf16 \
        --batch-size 16 --out /tmp/bf16.jsonl --time

What runs (each part written from NeMo 3.0.0's documented behaviour, sizes read from
`model_config.yaml`):
- features in fp32 whatever --dtype says (NeMo runs its preprocessor outside autocast):
  preemphasis (zeroed past each clip), centred STFT with zero padding (NeMo >= 2.5; reflect
  padding of older NeMo is not implemented), power spectrum, the checkpoint's stored mel
  filterbank and window (Slaney mel / symmetric Hann if absent), log(x + 2^-24), per-feature
  normalisation over the valid frames with the unbiased std + 1e-5, zeros past the valid frames;
- the FastConformer encoder (dw_striding subsampling with NeMo's per-layer length masking,
  rel_pos attention with untied biases, xscaling per config, macaron feed-forwards, convolution
  module with BatchNorm), batched with length masks; only `rel_pos` with full context is
  supported: `rel_pos_local_attn` models are refused;
- greedy label-looping TDT decoding with NeMo's rules (blank advances >= 1 frame, non-blank
  emitted with its duration, prediction state updated only for emitting rows, at most
  `max_symbols` labels per frame), written as one fixed-shape step per joint evaluation so that
  on CUDA it is captured once per (batch, frame bucket) in a CUDA graph and replayed.

--dtype fp32 is strict fp32 (TF32 disabled for cuBLAS and cuDNN). --dtype bf16 is
`module.to(torch.bfloat16)` of the whole model (encoder and decoder), as a user
would do; --decoder-dtype fp32 keeps the prediction/joint networks in fp32 instead.
--attention sdpa uses torch's scaled_dot_product_attention with the position term as an additive
mask (NeMo's use_pytorch_sdpa=True) instead of NeMo's default manual softmax.

Output (--out, JSON lines, manifest order): {"path", "seconds", "tokens", "frames", "durations"}.
A summary JSON line (audio seconds, wall seconds per stage, RTFx) goes to stderr (and to
--summary FILE). With --time the
whole set is first run once untimed (warm-up: cuDNN/cuBLAS heuristics, CUDA graph capture), then
timed: length-sorted batches, audio already in host memory (WAV decoding excluded), wall clock
with CUDA synchronisation, covering host-to-device copy, features, encoder, decoding and the copy
of tokens back.

Input: --manifest JSON lines {"path", "seconds"} (paths relative to the manifest's directory are
resolved there; outputs echo the path as written), or --wav FILE... . WAVs: 16-bit PCM mono at
the model's sample rate.
"""
import argparse
import io
import json
import math
import sys
import tarfile
import time
import wave
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml
from torch import nn

LOG_GUARD = 2.0**-24
NORMALIZE_STD_EPS = 1e-5
ATTENTION_MASK_VALUE = -10000.0  # NeMo masks attention scores with -INF_VAL = -10000


# ----------------------------------------------------------------------------- checkpoint


def load_nemo(path: Path):
    with tarfile.open(path) as tar:
        by_name = {Path(m.name).name: m for m in tar.getmembers() if m.isfile()}
        for needed in ("model_config.yaml", "model_weights.ckpt"):
            if needed not in by_name:
                raise SystemExit(f"{path}: no {needed} inside")
        cfg = yaml.safe_load(tar.extractfile(by_name["model_config.yaml"]).read())
        weights = io.BytesIO(tar.extractfile(by_name["model_weights.ckpt"]).read())
    return cfg, torch.load(weights, map_location="cpu", weights_only=True)


def refuse(condition: bool, what: str) -> None:
    if condition:
        raise SystemExit(f"unsupported model: {what}")


# ----------------------------------------------------------------------------- features


def slaney_mel_filterbank(sr: int, n_fft: int, n_mels: int, fmin: float, fmax: float) -> torch.Tensor:
    """librosa.filters.mel(norm='slaney', htk=False), in float64."""
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, math.log(6.4) / 27.0

    def hz_to_mel(f: float) -> float:
        return f / f_sp if f < min_log_hz else min_log_mel + math.log(f / min_log_hz) / logstep

    def mel_to_hz(m: torch.Tensor) -> torch.Tensor:
        return torch.where(m < min_log_mel, m * f_sp, min_log_hz * torch.exp(logstep * (m - min_log_mel)))

    mels = torch.linspace(hz_to_mel(fmin), hz_to_mel(fmax), n_mels + 2, dtype=torch.float64)
    mel_f = mel_to_hz(mels)
    freqs = torch.linspace(0, sr / 2, n_fft // 2 + 1, dtype=torch.float64)
    fdiff = mel_f[1:] - mel_f[:-1]
    ramps = mel_f[:, None] - freqs[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = torch.clamp(torch.minimum(lower, upper), min=0)
    weights *= (2.0 / (mel_f[2:] - mel_f[:-2]))[:, None]
    return weights.float()


class Features(nn.Module):
    """NeMo's FilterbankFeatures at inference (fp32, zero-padded centred STFT)."""

    def __init__(self, cfg: dict, sd: dict):
        super().__init__()
        sr = cfg.get("sample_rate", 16000)
        self.sample_rate = sr
        self.win = cfg.get("n_window_size") or int(cfg["window_size"] * sr)
        self.hop = cfg.get("n_window_stride") or int(cfg["window_stride"] * sr)
        self.n_fft = cfg.get("n_fft") or 2 ** math.ceil(math.log2(self.win))
        self.n_mels = cfg.get("features", 64)
        self.preemph = cfg.get("preemph", 0.97)
        self.pad_to = cfg.get("pad_to", 16)
        self.pad_value = cfg.get("pad_value", 0.0)
        self.normalize = cfg.get("normalize", "per_feature")
        refuse(cfg.get("window", "hann") != "hann", f"window {cfg.get('window')}")
        refuse(cfg.get("log", True) is not True, "features without log")
        refuse(cfg.get("log_zero_guard_type", "add") != "add", "log_zero_guard_type other than add")
        refuse(cfg.get("log_zero_guard_value", LOG_GUARD) != LOG_GUARD, "log_zero_guard_value other than 2^-24")
        refuse(cfg.get("mag_power", 2.0) != 2.0, "mag_power other than 2")
        refuse(cfg.get("frame_splicing", 1) != 1, "frame_splicing")
        refuse(bool(cfg.get("exact_pad", False)), "exact_pad")
        refuse(self.normalize not in ("per_feature", None, "NA", "None"), f"normalize {self.normalize}")
        fb = sd.get("preprocessor.featurizer.fb")
        if fb is None:
            fmax = cfg.get("highfreq") or sr / 2
            fb = slaney_mel_filterbank(sr, self.n_fft, self.n_mels, cfg.get("lowfreq", 0), fmax)
        window = sd.get("preprocessor.featurizer.window")
        if window is None:
            window = torch.hann_window(self.win, periodic=False)
        self.register_buffer("fb", fb.float().reshape(self.n_mels, self.n_fft // 2 + 1))
        self.register_buffer("window", window.float())

    def forward(self, audio: torch.Tensor, samples: torch.Tensor):
        """audio [B, N] fp32 zero-padded, samples [B] -> features [B, n_mels, T], frames [B]."""
        frames = torch.div(samples + self.n_fft // 2 * 2 - self.n_fft, self.hop, rounding_mode="floor")
        if self.preemph:
            in_clip = torch.arange(audio.shape[1], device=audio.device)[None, :] < samples[:, None]
            audio = torch.cat([audio[:, :1], audio[:, 1:] - self.preemph * audio[:, :-1]], dim=1)
            audio = audio.masked_fill(~in_clip, 0.0)
        spec = torch.stft(audio, n_fft=self.n_fft, hop_length=self.hop, win_length=self.win,
                          window=self.window, center=True, pad_mode="constant", return_complex=True)
        power = torch.view_as_real(spec).pow(2).sum(-1).sqrt().pow(2)
        x = torch.log(torch.matmul(self.fb, power) + LOG_GUARD)
        valid = torch.arange(x.shape[-1], device=x.device)[None, :] < frames[:, None]
        if self.normalize == "per_feature":
            v = valid[:, None, :]
            n = valid.sum(1)[:, None].to(x.dtype)
            mean = torch.where(v, x, 0.0).sum(2) / n
            std = torch.sqrt(torch.where(v, x - mean[:, :, None], 0.0).pow(2).sum(2) / (n - 1.0))
            std = std.masked_fill(std.isnan(), 0.0) + NORMALIZE_STD_EPS
            x = (x - mean[:, :, None]) / std[:, :, None]
        x = x.masked_fill(~valid[:, None, :], self.pad_value)
        if self.pad_to and self.pad_to > 0 and x.shape[-1] % self.pad_to:
            x = F.pad(x, (0, self.pad_to - x.shape[-1] % self.pad_to), value=self.pad_value)
        return x, frames


# ----------------------------------------------------------------------------- encoder


class Subsampling(nn.Module):
    """dw_striding: Conv2d(1,c,3,s2) ReLU [dw Conv2d(c,c,3,s2) pw 1x1 ReLU]*(n-1), then Linear."""

    def __init__(self, feat_in: int, d_model: int, channels: int, factor: int):
        super().__init__()
        stages = int(math.log2(factor))
        refuse(2**stages != factor, f"subsampling factor {factor}")
        layers = [nn.Conv2d(1, channels, 3, 2, 1), nn.ReLU()]
        for _ in range(stages - 1):
            layers += [nn.Conv2d(channels, channels, 3, 2, 1, groups=channels),
                       nn.Conv2d(channels, channels, 1), nn.ReLU()]
        self.conv = nn.Sequential(*layers)
        freq = feat_in
        for _ in range(stages):
            freq = (freq + 2 - 3) // 2 + 1
        self.out = nn.Linear(channels * freq, d_model)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor):
        # x [B, T, F]. Like NeMo 3.0.0, padded time steps are zeroed before every layer, with the
        # length after each strided convolution.
        x = x.unsqueeze(1)
        t_index = torch.arange(x.shape[2], device=x.device)
        x = x * (t_index[None, :] < lengths[:, None]).to(x.dtype)[:, None, :, None]
        lengths = lengths.float()
        for layer in self.conv:
            x = layer(x)
            if isinstance(layer, nn.Conv2d) and layer.stride != (1, 1):
                lengths = torch.floor((lengths + 2 - 3) / 2 + 1)
            t_index = torch.arange(x.shape[2], device=x.device)
            x = x * (t_index[None, :] < lengths[:, None]).to(x.dtype)[:, None, :, None]
        b, c, t, f = x.shape
        return self.out(x.transpose(1, 2).reshape(b, t, c * f)), lengths.long()


def relative_positions(length: int, d_model: int, dtype, device) -> torch.Tensor:
    """Sinusoidal table for relative positions length-1 .. -(length-1), [1, 2L-1, d]."""
    positions = torch.arange(length - 1, -length, -1, dtype=torch.float32, device=device)[:, None]
    div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32, device=device)
                    * -(math.log(10000.0) / d_model))
    pe = torch.zeros(positions.shape[0], d_model, device=device)
    pe[:, 0::2] = torch.sin(positions * div)
    pe[:, 1::2] = torch.cos(positions * div)
    return pe[None].to(dtype)


class RelPosAttention(nn.Module):
    def __init__(self, d: int, heads: int, bias: bool, use_sdpa: bool):
        super().__init__()
        self.h, self.dk, self.use_sdpa = heads, d // heads, use_sdpa
        self.linear_q, self.linear_k = nn.Linear(d, d, bias=bias), nn.Linear(d, d, bias=bias)
        self.linear_v, self.linear_out = nn.Linear(d, d, bias=bias), nn.Linear(d, d, bias=bias)
        self.linear_pos = nn.Linear(d, d, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(heads, self.dk))
        self.pos_bias_v = nn.Parameter(torch.zeros(heads, self.dk))

    @staticmethod
    def rel_shift(x: torch.Tensor) -> torch.Tensor:
        b, h, q, p = x.shape
        x = F.pad(x, (1, 0)).view(b, h, p + 1, q)
        return x[:, :, 1:].reshape(b, h, q, p)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.linear_q(x).view(b, t, self.h, self.dk)
        k = self.linear_k(x).view(b, t, self.h, self.dk).transpose(1, 2)
        v = self.linear_v(x).view(b, t, self.h, self.dk).transpose(1, 2)
        p = self.linear_pos(pos).view(1, -1, self.h, self.dk).transpose(1, 2)
        q_u = (q + self.pos_bias_u).transpose(1, 2)
        q_v = (q + self.pos_bias_v).transpose(1, 2)
        bd = self.rel_shift(torch.matmul(q_v, p.transpose(-2, -1)))[:, :, :, :t]
        mask = mask[:, None]  # [B, 1, T, T], True = masked
        if self.use_sdpa:
            bd = (bd / math.sqrt(self.dk)).masked_fill(mask, ATTENTION_MASK_VALUE)
            out = F.scaled_dot_product_attention(q_u, k, v, attn_mask=bd)
            out = out.masked_fill(mask.all(-1, keepdim=True), 0.0)
        else:
            scores = (torch.matmul(q_u, k.transpose(-2, -1)) + bd) / math.sqrt(self.dk)
            attn = torch.softmax(scores.masked_fill(mask, ATTENTION_MASK_VALUE), dim=-1).masked_fill(mask, 0.0)
            out = torch.matmul(attn, v)
        return self.linear_out(out.transpose(1, 2).reshape(b, t, self.h * self.dk))


class FeedForward(nn.Module):
    def __init__(self, d: int, hidden: int, bias: bool):
        super().__init__()
        self.linear1, self.linear2 = nn.Linear(d, hidden, bias=bias), nn.Linear(hidden, d, bias=bias)

    def forward(self, x):
        return self.linear2(F.silu(self.linear1(x)))


class ConvModule(nn.Module):
    def __init__(self, d: int, kernel: int, bias: bool):
        super().__init__()
        self.pointwise_conv1 = nn.Conv1d(d, 2 * d, 1, bias=bias)
        self.depthwise_conv = nn.Conv1d(d, d, kernel, padding=(kernel - 1) // 2, groups=d, bias=bias)
        self.batch_norm = nn.BatchNorm1d(d)
        self.pointwise_conv2 = nn.Conv1d(d, d, 1, bias=bias)

    def forward(self, x, pad_mask):
        x = F.glu(self.pointwise_conv1(x.transpose(1, 2)), dim=1)
        x = x.masked_fill(pad_mask[:, None, :], 0.0)
        x = F.silu(self.batch_norm(self.depthwise_conv(x)))
        return self.pointwise_conv2(x).transpose(1, 2)


class ConformerLayer(nn.Module):
    def __init__(self, d, heads, ff_hidden, kernel, bias, use_sdpa):
        super().__init__()
        self.norm_feed_forward1, self.feed_forward1 = nn.LayerNorm(d), FeedForward(d, ff_hidden, bias)
        self.norm_self_att, self.self_attn = nn.LayerNorm(d), RelPosAttention(d, heads, bias, use_sdpa)
        self.norm_conv, self.conv = nn.LayerNorm(d), ConvModule(d, kernel, bias)
        self.norm_feed_forward2, self.feed_forward2 = nn.LayerNorm(d), FeedForward(d, ff_hidden, bias)
        self.norm_out = nn.LayerNorm(d)

    def forward(self, x, pos, att_mask, pad_mask):
        x = x + 0.5 * self.feed_forward1(self.norm_feed_forward1(x))
        x = x + self.self_attn(self.norm_self_att(x), pos, att_mask)
        x = x + self.conv(self.norm_conv(x), pad_mask)
        x = x + 0.5 * self.feed_forward2(self.norm_feed_forward2(x))
        return self.norm_out(x)


class Encoder(nn.Module):
    def __init__(self, cfg: dict, use_sdpa: bool):
        super().__init__()
        refuse(cfg.get("subsampling") != "dw_striding", f"subsampling {cfg.get('subsampling')}")
        refuse(cfg.get("self_attention_model", "rel_pos") != "rel_pos",
               f"self_attention_model {cfg.get('self_attention_model')} (only rel_pos is implemented)")
        refuse(list(cfg.get("att_context_size") or [-1, -1]) != [-1, -1], "limited attention context")
        refuse(cfg.get("untie_biases", True) is not True, "tied positional biases")
        refuse(cfg.get("conv_norm_type", "batch_norm") != "batch_norm", "conv norm other than batch_norm")
        refuse(bool(cfg.get("causal_downsampling", False)), "causal downsampling")
        refuse(cfg.get("feat_out", -1) not in (-1, None), "encoder feat_out projection")
        d, bias = cfg["d_model"], cfg.get("use_bias", True)
        self.d_model = d
        self.xscale = math.sqrt(d) if cfg.get("xscaling", True) else None
        self.pre_encode = Subsampling(cfg["feat_in"], d, cfg.get("subsampling_conv_channels", d),
                                      cfg.get("subsampling_factor", 4))
        self.layers = nn.ModuleList(
            ConformerLayer(d, cfg["n_heads"], d * cfg.get("ff_expansion_factor", 4),
                           cfg.get("conv_kernel_size", 31), bias, use_sdpa)
            for _ in range(cfg["n_layers"]))

    def forward(self, feats: torch.Tensor, lengths: torch.Tensor):
        """feats [B, F, T] -> [B, T', d], lengths [B]."""
        x, lengths = self.pre_encode(feats.transpose(1, 2), lengths)
        if self.xscale:
            x = x * self.xscale
        t = x.shape[1]
        pos = relative_positions(t, self.d_model, x.dtype, x.device)
        valid = torch.arange(t, device=x.device)[None, :] < lengths[:, None]
        att_mask = ~(valid[:, :, None] & valid[:, None, :])
        pad_mask = ~valid
        for layer in self.layers:
            x = layer(x, pos, att_mask, pad_mask)
        return x, lengths


# ----------------------------------------------------------------------------- decoder


class Prediction(nn.Module):
    def __init__(self, vocab: int, hidden: int, layers: int):
        super().__init__()
        self.embed = nn.Embedding(vocab + 1, hidden)
        self.dec_rnn = nn.Module()
        self.dec_rnn.lstm = nn.LSTM(hidden, hidden, num_layers=layers, batch_first=True)


class Joint(nn.Module):
    def __init__(self, enc: int, pred: int, hidden: int, n_out: int, final_index: int):
        super().__init__()
        self.enc, self.pred = nn.Linear(enc, hidden), nn.Linear(pred, hidden)
        # NeMo: Sequential(ReLU, [Dropout], Linear); the Linear's index depends on the dropout.
        self.joint_net = nn.Sequential(nn.ReLU(), *([nn.Identity()] * (final_index - 1)),
                                       nn.Linear(hidden, n_out))


class Parakeet(nn.Module):
    def __init__(self, cfg: dict, sd: dict, use_sdpa: bool):
        super().__init__()
        self.encoder = Encoder(cfg["encoder"], use_sdpa)
        dec, joint = cfg["decoder"], cfg["joint"]
        self.vocab = dec["vocab_size"]
        self.blank = self.vocab
        self.pred_hidden = dec["prednet"]["pred_hidden"]
        self.decoder = nn.Module()
        self.decoder.prediction = Prediction(self.vocab, self.pred_hidden, dec["prednet"].get("pred_rnn_layers", 1))
        decoding = cfg.get("decoding", {})
        self.durations = list(decoding.get("durations") or cfg.get("model_defaults", {}).get("tdt_durations") or [])
        refuse(not self.durations, "no TDT durations in the config (not a TDT model)")
        refuse(joint.get("num_extra_outputs", len(self.durations)) != len(self.durations), "duration count")
        self.max_symbols = (decoding.get("greedy") or {}).get("max_symbols") or 10
        finals = sorted(int(k.split(".")[2]) for k in sd if k.startswith("joint.joint_net.") and k.endswith(".weight"))
        refuse(not finals, "no joint.joint_net.N.weight")
        jn = joint["jointnet"]
        refuse(jn.get("activation", "relu") != "relu", "joint activation other than relu")
        self.joint = Joint(jn["encoder_hidden"], jn["pred_hidden"], jn["joint_hidden"],
                           self.vocab + 1 + len(self.durations), finals[-1])


class GreedyTdt:
    """NeMo's label-looping TDT rules, one joint evaluation per row per step, fixed shapes: the
    buffers (and on CUDA the captured step graph) are made once per (batch, frames) shape and
    reused for every batch of that shape."""

    def __init__(self, model: Parakeet, batch: int, frames: int, device, use_graph: bool):
        self.m = model
        dtype = model.joint.pred.weight.dtype
        self.dtype = dtype
        self.cap = frames * model.max_symbols
        self.rows = torch.arange(batch, device=device)
        self.durations = torch.tensor(model.durations, device=device)
        lstm = model.decoder.prediction.dec_rnn.lstm
        self.enc_proj = torch.zeros(batch, frames, model.joint.enc.out_features, device=device, dtype=dtype)
        self.lengths = torch.zeros(batch, device=device, dtype=torch.long)
        self.h = torch.zeros(lstm.num_layers, batch, model.pred_hidden, device=device, dtype=dtype)
        self.c = torch.zeros_like(self.h)
        self.g = torch.zeros(batch, model.joint.pred.out_features, device=device, dtype=dtype)
        self.time = torch.zeros(batch, device=device, dtype=torch.long)
        self.emit_frame = torch.zeros_like(self.time)
        self.emit_count = torch.zeros_like(self.time)
        self.count = torch.zeros_like(self.time)
        self.tokens = torch.zeros(batch, self.cap + 1, device=device, dtype=torch.long)
        self.frames = torch.zeros_like(self.tokens)
        self.durs = torch.zeros_like(self.tokens)
        self.graph = self._capture() if use_graph else None

    def reset(self, enc: torch.Tensor, enc_len: torch.Tensor) -> None:
        """Start every row at frame 0, the prediction network fed blank (SOS) from a zero state."""
        m, p = self.m, self.m.decoder.prediction
        self.enc_proj.copy_(m.joint.enc(enc.to(self.dtype)))
        self.lengths.copy_(enc_len)
        sos = torch.full_like(self.time, m.blank)
        zeros = torch.zeros_like(self.h)
        out, (h, c) = p.dec_rnn.lstm(p.embed(sos)[:, None], (zeros, zeros))
        self.h.copy_(h)
        self.c.copy_(c)
        self.g.copy_(m.joint.pred(out[:, 0]))
        for x in (self.time, self.emit_count, self.count):
            x.zero_()
        self.emit_frame.fill_(-1)

    def step(self) -> None:
        m, p, n_cls = self.m, self.m.decoder.prediction, self.m.vocab + 1
        active = self.time < self.lengths
        t = torch.minimum(self.time, self.lengths - 1).clamp(min=0)
        logits = m.joint.joint_net(self.enc_proj[self.rows, t] + self.g)
        label = logits[:, :n_cls].argmax(-1)
        dur = self.durations[logits[:, n_cls:].argmax(-1)]
        blank = label == m.blank
        dur = torch.where(blank & (dur == 0), 1, dur)
        emit = active & ~blank
        slot = torch.where(emit, self.count, self.cap)[:, None]
        self.tokens.scatter_(1, slot, label[:, None])
        self.frames.scatter_(1, slot, self.time[:, None])
        self.durs.scatter_(1, slot, dur[:, None])
        self.count.add_(emit.long())
        same_frame = self.emit_frame == self.time
        self.emit_count.copy_(torch.where(emit, torch.where(same_frame, self.emit_count + 1, 1), self.emit_count))
        self.emit_frame.copy_(torch.where(emit, self.time, self.emit_frame))
        self.time.copy_(torch.where(active, self.time + dur, self.time))
        out, (h2, c2) = p.dec_rnn.lstm(p.embed(label)[:, None], (self.h, self.c))
        keep = emit[None, :, None]
        self.h.copy_(torch.where(keep, h2, self.h))
        self.c.copy_(torch.where(keep, c2, self.c))
        self.g.copy_(torch.where(emit[:, None], m.joint.pred(out[:, 0]), self.g))
        force = (emit & (self.emit_count >= m.max_symbols) & (self.emit_frame == self.time)
                 & (self.time < self.lengths))
        self.time.add_(force.long())

    def _capture(self) -> torch.cuda.CUDAGraph:
        # Warm up on a side stream (on the zeroed buffers: all rows inactive), then capture.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.step()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.step()
        return graph

    def decode(self, enc: torch.Tensor, enc_len: torch.Tensor, steps_per_check: int = 16):
        self.reset(enc, enc_len)
        while bool((self.time < self.lengths).any()):
            for _ in range(steps_per_check):
                self.graph.replay() if self.graph is not None else self.step()
        counts = self.count.tolist()
        tokens, frames, durs = self.tokens.tolist(), self.frames.tolist(), self.durs.tolist()
        return [(tokens[b][:n], frames[b][:n], durs[b][:n]) for b, n in enumerate(counts)]


# ----------------------------------------------------------------------------- driver


def read_wav(path: Path, sample_rate: int) -> torch.Tensor:
    with wave.open(str(path), "rb") as w:
        if w.getnchannels() != 1 or w.getsampwidth() != 2 or w.getframerate() != sample_rate:
            raise SystemExit(f"{path}: need 16-bit mono {sample_rate} Hz PCM, got {w.getnchannels()} ch, "
                             f"{8 * w.getsampwidth()} bit, {w.getframerate()} Hz")
        data = w.readframes(w.getnframes())
    return torch.frombuffer(bytearray(data), dtype=torch.int16).float() / 32768.0


def read_inputs(args) -> list:
    if args.manifest:
        base = args.manifest.parent
        entries = [json.loads(line) for line in args.manifest.read_text().splitlines() if line.strip()]
        return [(e["path"], base / e["path"]) for e in entries]
    return [(str(p), p) for p in args.wav]


class Transcriber:
    def __init__(self, args, device):
        cfg, sd = load_nemo(args.model)
        self.device = device
        self.features = Features(cfg["preprocessor"], sd).to(device)
        model = Parakeet(cfg, sd, args.attention == "sdpa")
        weights = {k: v for k, v in sd.items() if not k.startswith("preprocessor.")}
        model.load_state_dict(weights, strict=True)
        self.model = model.eval().to(device)
        dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
        self.enc_dtype = dtypes[args.dtype]
        self.model.encoder.to(self.enc_dtype)
        self.model.decoder.to(dtypes[args.decoder_dtype or args.dtype])
        self.model.joint.to(dtypes[args.decoder_dtype or args.dtype])
        self.use_graph = device.type == "cuda" and not args.no_cuda_graph
        self.frame_bucket = args.frame_bucket
        self.totals = {"features": 0.0, "encoder": 0.0, "decoder": 0.0}
        self.decoders = {}

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def batch(self, clips: list) -> list:
        started = time.perf_counter()
        samples = torch.tensor([len(c) for c in clips], dtype=torch.long)
        audio = torch.zeros(len(clips), int(samples.max()))
        for i, c in enumerate(clips):
            audio[i, : len(c)] = c
        audio, samples = audio.to(self.device, non_blocking=True), samples.to(self.device)
        feats, frames = self.features(audio, samples)
        self.sync()
        t1 = time.perf_counter()
        enc, enc_len = self.model.encoder(feats.to(self.enc_dtype), frames)
        if self.frame_bucket > 1 and enc.shape[1] % self.frame_bucket:
            # Bucketed frame counts let CUDA graphs be reused across batches (padding is never read).
            enc = F.pad(enc, (0, 0, 0, self.frame_bucket - enc.shape[1] % self.frame_bucket))
        self.sync()
        t2 = time.perf_counter()
        shape = (enc.shape[0], enc.shape[1])
        if shape not in self.decoders:
            self.decoders[shape] = GreedyTdt(self.model, *shape, self.device, self.use_graph)
        hyps = self.decoders[shape].decode(enc, enc_len)
        t3 = time.perf_counter()
        for key, dt in zip(self.totals, (t1 - started, t2 - t1, t3 - t2)):
            self.totals[key] += dt
        return hyps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help=".nemo file")
    ap.add_argument("--manifest", type=Path)
    ap.add_argument("--wav", type=Path, nargs="*", default=[])
    ap.add_argument("--out", type=Path, help="JSON lines output (default: stdout)")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--decoder-dtype", choices=["fp32", "bf16"], help="default: --dtype")
    ap.add_argument("--attention", choices=["manual", "sdpa"], default="manual")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-cuda-graph", action="store_true", help="run the decoder step eagerly")
    ap.add_argument("--frame-bucket", type=int, default=64, help="pad encoder frames to a multiple")
    ap.add_argument("--time", action="store_true", help="untimed warm-up pass first, then print RTFx")
    ap.add_argument("--threads", type=int, help="torch CPU threads")
    ap.add_argument("--summary", type=Path, help="also write the summary JSON line here")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    # fp32 must be fp32 on the GPU too: no TF32 in cuBLAS or cuDNN (convolutions, LSTM).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    inputs = read_inputs(args)
    if not inputs:
        raise SystemExit("no input clips (--manifest or --wav)")
    device = torch.device(args.device)
    with torch.inference_mode():
        tr = Transcriber(args, device)
        audio = [read_wav(path, tr.features.sample_rate) for _, path in inputs]
        order = sorted(range(len(audio)), key=lambda i: -len(audio[i]))
        batches = [order[i: i + args.batch_size] for i in range(0, len(order), args.batch_size)]
        if args.time:
            for idx in batches:
                tr.batch([audio[i] for i in idx])
            tr.totals = dict.fromkeys(tr.totals, 0.0)
        tr.sync()
        started = time.perf_counter()
        results = {}
        for idx in batches:
            for i, hyp in zip(idx, tr.batch([audio[i] for i in idx])):
                results[i] = hyp
        tr.sync()
        wall = time.perf_counter() - started
    out = open(args.out, "w") if args.out else sys.stdout
    for i, (name, _) in enumerate(inputs):
        tokens, frames, durs = results[i]
        out.write(json.dumps({"path": name, "seconds": len(audio[i]) / tr.features.sample_rate,
                              "tokens": tokens, "frames": frames, "durations": durs}) + "\n")
    if args.out:
        out.close()
    audio_s = sum(len(a) for a in audio) / tr.features.sample_rate
    summary = {"dtype": args.dtype, "decoder_dtype": args.decoder_dtype or args.dtype,
               "attention": args.attention, "batch_size": args.batch_size, "clips": len(audio),
               "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               "cuda_graph": tr.use_graph, "warmed_up": args.time, "audio_s": round(audio_s, 3),
               "wall_s": round(wall, 4), "rtfx": round(audio_s / wall, 1),
               **{f"{k}_s": round(v, 4) for k, v in tr.totals.items()}}
    print(json.dumps(summary), file=sys.stderr)
    if args.summary:
        args.summary.write_text(json.dumps(summary) + "\n")
    if args.time:
        print(f"RESULT pytorch transcribe dtype={args.dtype} batch={args.batch_size}: "
              f"{audio_s:.1f} audio-s in {wall:.3f} s = RTFx {audio_s / wall:.0f}", file=sys.stderr)


if __name__ == "__main__":
    main()
