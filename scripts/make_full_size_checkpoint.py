"""Write a full-size Parakeet TDT 0.6B v2 architecture checkpoint with seeded random weights.

    /work/venvs/nemo/bin/python scripts/make_full_size_checkpoint.py --out PATH.nemo [--onnx DIR]

Real key names and shapes (24 layers, d_model 1024, 1024-piece BPE, durations 0-4, ...), built by
NeMo itself, for loading and speed work. Made on demand, never checked in (~2.5 GB).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))

from build import final_joint_linear, seed_everything  # noqa: E402
from model_config import FULL_SIZE_V2, tdt_config  # noqa: E402
from tokenizer import train_tokenizer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path, help="where to write the .nemo")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--onnx", type=Path, help="also export NeMo's ONNX (encoder-model.onnx + decoder_joint-model.onnx) here")
    args = parser.parse_args()

    from nemo.collections.asr.models import EncDecRNNTBPEModel

    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        tok_dir = train_tokenizer(Path(tmp) / "tokenizer", vocab_size=1024, synthetic=20000)
        seed_everything(args.seed)
        model = EncDecRNNTBPEModel(cfg=tdt_config(FULL_SIZE_V2, str(tok_dir))).eval()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        model.save_to(str(args.out))
    n_params = sum(p.numel() for p in model.state_dict().values() if p.dtype.is_floating_point)
    print(f"wrote {args.out}: {args.out.stat().st_size / 1e9:.2f} GB, {n_params / 1e6:.1f}M float parameters, "
          f"final joint Linear {[n for n, m in model.joint.named_modules() if m is final_joint_linear(model)][0]}, "
          f"{time.time() - started:.0f} s")
    if args.onnx:
        args.onnx.mkdir(parents=True, exist_ok=True)
        with torch.no_grad():
            model.export(str(args.onnx / "model.onnx"), check_trace=False)
        print(f"exported ONNX to {args.onnx}")


if __name__ == "__main__":
    main()
