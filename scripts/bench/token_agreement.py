#!/usr/bin/env python3
"""Token agreement of candidate transcriptions with a reference (e.g. PyTorch bf16 and our
engine against PyTorch fp32), as a markdown table.

    python3 scripts/bench/token_agreement.py fp32.jsonl bf16.jsonl ours_bf16.jsonl \
        [--names "PyTorch fp32,PyTorch bf16,ours bf16"]

Every file is JSON lines with at least {"path": ..., "tokens": [ids]} per clip (other keys and
lines without "tokens" are ignored). The first file is the reference. Clips are matched by
"path", or by file name when the paths differ in their directories. Per candidate:
- identical: clips whose token sequence equals the reference's exactly;
- agreement: 1 - (sum over clips of the Levenshtein distance between the two token sequences)
  / (sum over clips of the reference length);
- missing: reference clips the candidate lacks (counted as fully wrong: distance = reference length).
Uses torch for the edit-distance rows when it is importable, plain Python otherwise.
"""
import argparse
import json
import os
import sys


def read(path: str) -> dict:
    out = {}
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            rec = json.loads(line)
            if "tokens" in rec:
                out[rec["path"]] = [int(t) for t in rec["tokens"]]
    return out


def match(ref: dict, cand: dict) -> dict:
    """Candidate sequences keyed by the reference's paths."""
    if set(ref) <= set(cand):
        return cand
    by_name = {os.path.basename(p): toks for p, toks in cand.items()}
    return {p: cand.get(p, by_name.get(os.path.basename(p))) for p in ref if p in cand or os.path.basename(p) in by_name}


def edit_distance(a: list, b: list) -> int:
    """Levenshtein distance (unit insert, delete, substitute)."""
    start = 0
    while start < min(len(a), len(b)) and a[start] == b[start]:
        start += 1
    end = 0
    while end < min(len(a), len(b)) - start and a[-1 - end] == b[-1 - end]:
        end += 1
    a, b = a[start: len(a) - end], b[start: len(b) - end]
    if not a or not b:
        return max(len(a), len(b))
    try:
        import torch
    except ImportError:
        return _edit_distance_python(a, b)
    return _edit_distance_torch(torch, a, b)


def _edit_distance_python(a: list, b: list) -> int:
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i] + [0] * len(b)
        for j, y in enumerate(b, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y))
        prev = cur
    return prev[-1]


def _edit_distance_torch(torch, a: list, b: list) -> int:
    # Row i from row i-1: deletions and substitutions elementwise; insertions along the row are
    # D[j] = min_k<=j (T[k] + j - k) = j + cummin(T[k] - k).
    bt = torch.tensor(b, dtype=torch.long)
    idx = torch.arange(len(b) + 1, dtype=torch.long)
    prev = idx.clone()
    for i, x in enumerate(a, 1):
        tmp = torch.empty_like(prev)
        tmp[0] = i
        tmp[1:] = torch.minimum(prev[1:] + 1, prev[:-1] + (bt != x).long())
        prev = idx + torch.cummin(tmp - idx, 0).values
    return int(prev[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", help="reference first, then candidates")
    ap.add_argument("--names", help="comma-separated labels, one per file")
    args = ap.parse_args()
    if len(args.files) < 2:
        ap.error("need a reference and at least one candidate")
    names = args.names.split(",") if args.names else args.files
    if len(names) != len(args.files):
        ap.error("--names needs one label per file")
    ref = read(args.files[0])
    if not ref:
        print(f"{args.files[0]}: no clips with tokens", file=sys.stderr)
        return 1
    ref_tokens = sum(len(t) for t in ref.values())
    print(f"reference: {names[0]}: {len(ref)} clips, {ref_tokens} tokens "
          f"({ref_tokens / len(ref):.1f} per clip)\n")
    print("| candidate | clips | identical | missing | ref tokens | edits | token agreement |")
    print("|---|---|---|---|---|---|---|")
    for name, path in zip(names[1:], args.files[1:]):
        cand = match(ref, read(path))
        identical = missing = edits = 0
        for clip, toks in ref.items():
            other = cand.get(clip)
            if other is None:
                missing += 1
                edits += len(toks)
                continue
            identical += other == toks
            edits += edit_distance(toks, other)
        agreement = 1 - edits / ref_tokens if ref_tokens else float("nan")
        print(f"| {name} | {len(ref)} | {identical} | {missing} | {ref_tokens} | {edits} | {agreement:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
