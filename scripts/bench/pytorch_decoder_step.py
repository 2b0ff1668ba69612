#!/usr/bin/env python3
"""Time of one label-looping TDT decoding step in plain PyTorch, captured in a CUDA graph: the
way a PyTorch user would run Parakeet TDT 0.6B v2's decoder (2-layer LSTM 640, joint 640, 1024
tokens + blank, durations 0-4) in bf16, random weights.

One step = embedding of the last labels -> LSTM step -> joint.pred -> add the projected encoder
frame each row looks at -> ReLU -> joint output -> argmax over labels and durations -> masked
state update and frame advance (rows that found blank keep their state). The encoder projection
is computed once per batch outside the step, as in NeMo.

Prints `RESULT pytorch decoder step batch=B: X us/step` (median of repeated graph replays).
"""
import argparse
import statistics

import torch

D_MODEL, HIDDEN, JOINT, VOCAB, DURATIONS = 1024, 640, 640, 1024, [0, 1, 2, 3, 4]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="1,4,16")
    parser.add_argument("--frames", type=int, default=375)
    parser.add_argument("--replays", type=int, default=2000)
    args = parser.parse_args()
    torch.manual_seed(0)
    dev, dt = torch.device("cuda"), torch.bfloat16
    embed = torch.nn.Embedding(VOCAB + 1, HIDDEN).to(dev, dt)
    lstm = torch.nn.LSTM(HIDDEN, HIDDEN, num_layers=2, batch_first=True).to(dev, dt)
    pred = torch.nn.Linear(HIDDEN, JOINT).to(dev, dt)
    enc = torch.nn.Linear(D_MODEL, JOINT).to(dev, dt)
    out = torch.nn.Linear(JOINT, VOCAB + 1 + len(DURATIONS)).to(dev, dt)
    durations = torch.tensor(DURATIONS, device=dev)
    print(f"GPU: {torch.cuda.get_device_name()}  torch {torch.__version__}")

    for batch in [int(b) for b in args.batches.split(",")]:
        with torch.inference_mode():
            enc_out = torch.randn(batch, args.frames, D_MODEL, device=dev, dtype=dt)
            enc_proj = enc(enc_out)
            labels = torch.full((batch,), VOCAB, device=dev, dtype=torch.long)
            h = torch.zeros(2, batch, HIDDEN, device=dev, dtype=dt)
            c = torch.zeros_like(h)
            time = torch.zeros(batch, device=dev, dtype=torch.long)
            rows = torch.arange(batch, device=dev)

            def step() -> None:
                g, (h2, c2) = lstm(embed(labels).unsqueeze(1), (h, c))
                frame = enc_proj[rows, time.clamp(max=args.frames - 1)]
                logits = out(torch.relu(frame + pred(g.squeeze(1))))
                label = logits[:, : VOCAB + 1].argmax(-1)
                dur = durations[logits[:, VOCAB + 1 :].argmax(-1)]
                emitted = label != VOCAB
                keep = emitted.view(1, -1, 1)
                h.copy_(torch.where(keep, h2, h))
                c.copy_(torch.where(keep, c2, c))
                labels.copy_(torch.where(emitted, label, labels))
                time.add_(torch.where(emitted, dur, dur.clamp(min=1)))
                time.remainder_(args.frames)

            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    step()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
            timings = []
            for _ in range(7):
                start, end = torch.cuda.Event(True), torch.cuda.Event(True)
                start.record()
                for _ in range(args.replays):
                    graph.replay()
                end.record()
                end.synchronize()
                timings.append(start.elapsed_time(end) * 1e3 / args.replays)
            print(
                f"RESULT pytorch decoder step batch={batch}: "
                f"{statistics.median(timings):.2f} us/step (CUDA graph replay, bf16)"
            )


if __name__ == "__main__":
    main()
