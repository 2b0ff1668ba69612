#!/usr/bin/env python3
"""Write a Parakeet TDT 0.6B v2-sized `.nemo` with seeded random weights, with only torch and
PyYAML (for the GPU machine, which has no NeMo): the config is the checked-in fixture's,
resized to the real architecture (24 layers, d_model 1024, 8 heads, 1024 tokens, LSTM 640,
joint 640, durations 0-4); key names and shapes are NeMo's.

    python3 scripts/bench/make_random_parakeet.py --out /tmp/parakeet-random.nemo

For loading, memory and speed work only: random weights decode nonsense.
"""
import argparse
import collections
import io
import tarfile
import time
from pathlib import Path

import torch
import yaml

FIXTURE = Path(__file__).resolve().parents[2] / "models/tests/fixtures/tdt-real-options/model.nemo"
D, LAYERS, HEADS, CHANNELS, PRED, JOINT, VOCAB = 1024, 24, 8, 256, 640, 640, 1024


def resized_config() -> dict:
    with tarfile.open(FIXTURE) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("model_config.yaml"))
        cfg = yaml.safe_load(tar.extractfile(member).read())
    enc = cfg["encoder"]
    enc.update(d_model=D, n_layers=LAYERS, n_heads=HEADS, subsampling_conv_channels=CHANNELS,
               use_bias=False, xscaling=False, self_attention_model="rel_pos",
               att_context_size=[-1, -1])
    cfg["decoder"]["vocab_size"] = VOCAB
    cfg["decoder"]["prednet"].update(pred_hidden=PRED, pred_rnn_layers=2)
    cfg["joint"]["num_classes"] = VOCAB
    cfg["joint"]["jointnet"].update(joint_hidden=JOINT, encoder_hidden=D, pred_hidden=PRED)
    cfg["joint"]["vocabulary"] = [f"\u2581p{i}" for i in range(VOCAB)]
    cfg["labels"] = cfg["joint"]["vocabulary"]
    for key in ("model_path", "vocab_path", "spe_tokenizer_vocab"):
        cfg.get("tokenizer", {}).pop(key, None)
    return cfg


def state_dict(seed: int) -> "collections.OrderedDict[str, torch.Tensor]":
    gen = torch.Generator().manual_seed(seed)
    sd = collections.OrderedDict()

    def rnd(*shape: int) -> torch.Tensor:
        return torch.empty(*shape).normal_(0, 0.02, generator=gen)

    c, d = CHANNELS, D
    sd["preprocessor.featurizer.window"] = torch.hann_window(400, periodic=False)
    sd["preprocessor.featurizer.fb"] = rnd(1, 128, 257).abs()
    p = "encoder.pre_encode"
    sd[f"{p}.conv.0.weight"], sd[f"{p}.conv.0.bias"] = rnd(c, 1, 3, 3), rnd(c)
    for dw, pw in [(2, 3), (5, 6)]:
        sd[f"{p}.conv.{dw}.weight"], sd[f"{p}.conv.{dw}.bias"] = rnd(c, 1, 3, 3), rnd(c)
        sd[f"{p}.conv.{pw}.weight"], sd[f"{p}.conv.{pw}.bias"] = rnd(c, c, 1, 1), rnd(c)
    sd[f"{p}.out.weight"], sd[f"{p}.out.bias"] = rnd(d, c * 16), rnd(d)
    for i in range(LAYERS):
        l = f"encoder.layers.{i}"
        for n in ["norm_feed_forward1", "norm_self_att", "norm_conv", "norm_feed_forward2", "norm_out"]:
            sd[f"{l}.{n}.weight"], sd[f"{l}.{n}.bias"] = torch.ones(d), torch.zeros(d)
        for ff in ["feed_forward1", "feed_forward2"]:
            sd[f"{l}.{ff}.linear1.weight"], sd[f"{l}.{ff}.linear2.weight"] = rnd(4 * d, d), rnd(d, 4 * d)
        for proj in ["linear_q", "linear_k", "linear_v", "linear_out", "linear_pos"]:
            sd[f"{l}.self_attn.{proj}.weight"] = rnd(d, d)
        sd[f"{l}.self_attn.pos_bias_u"] = rnd(HEADS, d // HEADS)
        sd[f"{l}.self_attn.pos_bias_v"] = rnd(HEADS, d // HEADS)
        sd[f"{l}.conv.pointwise_conv1.weight"] = rnd(2 * d, d, 1)
        sd[f"{l}.conv.depthwise_conv.weight"] = rnd(d, 1, 9)
        for s in ["weight", "bias", "running_mean"]:
            sd[f"{l}.conv.batch_norm.{s}"] = rnd(d)
        sd[f"{l}.conv.batch_norm.running_var"] = torch.ones(d)
        sd[f"{l}.conv.batch_norm.num_batches_tracked"] = torch.tensor(0)
        sd[f"{l}.conv.pointwise_conv2.weight"] = rnd(d, d, 1)
    sd["decoder.prediction.embed.weight"] = rnd(VOCAB + 1, PRED)
    for k in range(2):
        for w in ["weight_ih", "weight_hh"]:
            sd[f"decoder.prediction.dec_rnn.lstm.{w}_l{k}"] = rnd(4 * PRED, PRED)
        for b in ["bias_ih", "bias_hh"]:
            sd[f"decoder.prediction.dec_rnn.lstm.{b}_l{k}"] = rnd(4 * PRED)
    sd["joint.pred.weight"], sd["joint.pred.bias"] = rnd(JOINT, PRED), rnd(JOINT)
    sd["joint.enc.weight"], sd["joint.enc.bias"] = rnd(JOINT, d), rnd(JOINT)
    sd["joint.joint_net.2.weight"], sd["joint.joint_net.2.bias"] = rnd(VOCAB + 6, JOINT), rnd(VOCAB + 6)
    return sd


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    started = time.time()
    cfg = resized_config()
    weights = io.BytesIO()
    sd = state_dict(args.seed)
    params = sum(v.numel() for v in sd.values())
    torch.save(sd, weights)
    del sd
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(args.out, "w:") as tar:
        for name, data in [("model_config.yaml", yaml.safe_dump(cfg, allow_unicode=True, sort_keys=False).encode()),
                           ("model_weights.ckpt", weights.getbuffer())]:
            info = tarfile.TarInfo(f"./{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    print(f"wrote {args.out}: {params / 1e6:.1f}M parameters in {time.time() - started:.1f} s")


if __name__ == "__main__":
    main()
