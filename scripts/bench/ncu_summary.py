"""Per-kernel GPU time table from `ncu --csv --print-summary per-kernel --metrics
gpu__time_duration.sum` output (scripts/device/gpu_verify.sh step `profile`).

    python3 scripts/bench/ncu_summary.py ncu.csv [--per-pass-kernel split_qkv_heads --per-pass 24]

Kernel names are shortened to their first identifier. With --per-pass-kernel, times are divided
by (that kernel's invocations / --per-pass), i.e. given per encoder forward pass.
"""

from __future__ import annotations

import argparse
import csv
import io
import re
from collections import defaultdict


def short_name(name: str) -> str:
    match = re.match(r"\s*(?:void\s+)?([A-Za-z_][A-Za-z0-9_:]*)", name)
    return match.group(1) if match else name[:60]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--per-pass-kernel", default="split_qkv_heads")
    ap.add_argument("--per-pass", type=float, default=24.0)
    args = ap.parse_args()

    text = open(args.csv, encoding="utf-8", errors="replace").read()
    lines = [line for line in text.splitlines() if line.startswith('"')]
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    if not rows:
        raise SystemExit(f"no CSV rows in {args.csv}")
    cols = rows[0].keys()
    name_col = "Kernel Name" if "Kernel Name" in cols else next(
        c for c in cols if "Name" in c and "Metric" not in c and "Process" not in c
    )
    count_col = next(c for c in cols if "Invocations" in c or c == "Count")
    avg_col = next(c for c in cols if c in ("Average", "Avg", "Mean"))
    unit_col = next((c for c in cols if "Unit" in c), None)

    total_ns: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for row in rows:
        if "gpu__time_duration" not in row.get("Metric Name", "gpu__time_duration"):
            continue
        scale = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6}.get(
            (row.get(unit_col) or "ns").strip(), 1.0
        )
        n = int(float(row[count_col].replace(",", "")))
        avg = float(row[avg_col].replace(",", ""))
        key = short_name(row[name_col])
        total_ns[key] += avg * scale * n
        calls[key] += n

    passes = calls.get(args.per_pass_kernel, 0) / args.per_pass or 1.0
    grand = sum(total_ns.values())
    print(f"{len(rows)} summary rows; {passes:g} forward passes ({args.per_pass_kernel} count / {args.per_pass:g})")
    print("| kernel | calls per pass | ms per pass | share |")
    print("|---|---|---|---|")
    for key, ns in sorted(total_ns.items(), key=lambda kv: -kv[1]):
        print(f"| {key[:70]} | {calls[key] / passes:.1f} | {ns / passes / 1e6:.3f} | {ns / grand:.1%} |")
    print(f"| total | | {grand / passes / 1e6:.3f} | |")


if __name__ == "__main__":
    main()
