"""Combine the RESULT lines of encoder_bench (ours) and pytorch_encoder.py into one markdown table.

Usage: python3 side_by_side_table.py ours.log pytorch.log
"""

import re
import sys

OURS = re.compile(r"RESULT encoder batch=(\d+) x (\d+) s: median ([\d.]+) ms .*?= (\d+) audio-s")
THEIRS = re.compile(
    r"RESULT pytorch mode=(\w+) sdpa=(\w+) batch=(\d+) x (\d+) s: median ([\d.]+) ms .*?= (\d+) audio-s")


def main():
    rows = {}
    columns = ["ours"]
    for line in open(sys.argv[1], errors="replace"):
        if m := OURS.search(line):
            rows.setdefault((int(m[1]), int(m[2])), {})["ours"] = (float(m[3]), int(m[4]))
    for line in open(sys.argv[2], errors="replace"):
        if m := THEIRS.search(line):
            col = f"NeMo {m[1]}" + (" +sdpa" if m[2] == "True" else "")
            if col not in columns:
                columns.append(col)
            rows.setdefault((int(m[3]), int(m[4])), {})[col] = (float(m[5]), int(m[6]))
    print("| batch x length | " + " | ".join(f"{c} ms / audio-s per s" for c in columns)
          + " | ours / best NeMo |")
    print("|---" * (len(columns) + 2) + "|")
    for (b, s), cells in sorted(rows.items()):
        out = []
        for c in columns:
            out.append(f"{cells[c][0]:.2f} / {cells[c][1]:,}" if c in cells else "-")
        nemo = [v[1] for k, v in cells.items() if k != "ours"]
        ratio = f"{cells['ours'][1] / max(nemo):.2f}x" if nemo and "ours" in cells else "-"
        print(f"| {b} x {s} s | " + " | ".join(out) + f" | {ratio} |")


if __name__ == "__main__":
    main()
