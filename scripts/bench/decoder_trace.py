#!/usr/bin/env python3
"""Cycle trace of the decoding kernel: where a predicting step's time goes, seen by block 0.

`patch` writes a copy of kernels/decoder.cu in which block 0's thread 0 reads %clock64 at the
phase boundaries (and inside the tensor-core products) of every predicting step, and prints the
mean cycles between consecutive points when a launch ends ("TRACE" lines). Build a
`decoder_bench` with the patched file in place of decoder.cu (the kernels are compiled at run
time from the embedded source), run it on the GPU, then `report` summarizes the log.

  python3 scripts/bench/decoder_trace.py patch worker/cuda/kernels/decoder.cu /tmp/traced.cu
  python3 scripts/bench/decoder_trace.py report bench.log --steps 168 --skip 15 [--ghz 1.86]

Block 0's view only: a point after a block barrier includes the wait for the block's slowest
thread; a point after a staging includes the wait for the other blocks' values. The printing
slows a step by 4-6 us, so compare traces with traces.
"""
import argparse
import re
import statistics
import sys

HEADER = """
#define TRACE_MAX 64
__shared__ unsigned long long trace_step[TRACE_MAX], trace_acc[TRACE_MAX], trace_last;
__shared__ int trace_line[TRACE_MAX], trace_n, trace_count;
__device__ __forceinline__ unsigned long long trace_clock() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(t));
    return t;
}
#define TRACE()                                                              \\
    if (blockIdx.x == 0 && threadIdx.x == 0) {                               \\
        const unsigned long long now_ = trace_clock();                       \\
        if (trace_n < TRACE_MAX) {                                           \\
            trace_step[trace_n] = now_ - trace_last;                         \\
            trace_line[trace_n] = __LINE__;                                  \\
        }                                                                    \\
        trace_n++;                                                           \\
        trace_last = now_;                                                   \\
    }
"""

STEP_END = """
        TRACE();
        if (blockIdx.x == 0 && threadIdx.x == 0 && any_predicting) {
            if (trace_count == 0)
                for (int i = 0; i < TRACE_MAX; ++i) trace_acc[i] = 0;
            if (trace_count == 0 || trace_n == trace_count) {
                for (int i = 0; i < trace_n && i < TRACE_MAX; ++i) trace_acc[i] += trace_step[i];
                trace_count = trace_n;
                trace_acc[TRACE_MAX - 1] += 1;
            }
        }"""

LAUNCH_START = """    if (threadIdx.x == 0) trace_count = 0;
    __syncthreads();
    int step = 0;"""

LAUNCH_END = """    if (blockIdx.x == 0 && threadIdx.x == 0 && step > 0) {
        const unsigned long long n = trace_acc[TRACE_MAX - 1];
        printf("TRACE rows=%d steps=%d predicting=%llu points=%d\\n", p.rows, step, n,
               trace_count);
        for (int i = 0; i < trace_count && i < TRACE_MAX - 1; ++i)
            printf("TRACE pt %d line %d cycles %.0f\\n", i, trace_line[i],
                   (double)trace_acc[i] / (double)(n ? n : 1));
    }
    __syncthreads();  // every thread's cells are written"""

# (anchor, text placed before it, text placed after it): every anchor must occur once.
EDITS = [
    ("struct TdtParams {", HEADER, ""),
    ("    SUB_MARK(kind, 0);", "", "\n    TRACE();"),
    ("    stage_input();\n    if (piece == 0) {", "    stage_input();\n    TRACE();\n", ""),
    ("        SUB_MARK(kind, 1);", "", "\n        TRACE();"),
    ("        SUB_MARK(kind, 2);", "", "\n        TRACE();"),
    ("        // acc[t]: rows g and g + 8", "        TRACE();\n", ""),
    ("        const int outputs = min(count * 8", "        TRACE();\n", ""),
    ("            store_recurrent(own, cells, l - 1,", "            TRACE();\n", ""),
    ("        // One thread per row scans its outputs", "        TRACE();\n", ""),
    ("        const unsigned now = clock + (unsigned)step;",
     "        if (blockIdx.x == 0 && threadIdx.x == 0) {\n"
     "            trace_n = 0;\n            trace_last = trace_clock();\n        }\n", ""),
    ("        PROFILE_MARK(5);", "", STEP_END),
    ("    int step = 0;", "", ""),
    ("    __syncthreads();  // every thread's cells are written", "", ""),
] + [(f"PROFILE_MARK({i});", "", " TRACE();") for i in range(5)]


def patch(src, dst):
    text = open(src).read()
    for anchor, before, after in EDITS:
        if text.count(anchor) != 1:
            sys.exit(f"anchor not found exactly once: {anchor!r}")
        if anchor == "    int step = 0;":
            text = text.replace(anchor, LAUNCH_START)
        elif anchor.startswith("    __syncthreads();  // every thread's cells"):
            text = text.replace(anchor, LAUNCH_END)
        else:
            text = text.replace(anchor, before + anchor + after)
    open(dst, "w").write(text)


def report(log, steps, skip, ghz):
    """Median over the launches of one configuration (`steps` steps, after `skip` launches) of
    each point's mean cycles per predicting step, in ns."""
    launches, current = [], None
    for line in open(log, errors="replace"):
        if line.startswith("TRACE rows="):
            current = None
            if f"steps={steps} " in line:
                current = []
                launches.append(current)
        elif line.startswith("TRACE pt") and current is not None:
            m = re.search(r"line (\d+) cycles (\d+)", line)
            current.append((int(m[1]), float(m[2])))
    launches = [l for l in launches[skip:] if l and len(l) == len(launches[skip])]
    if not launches:
        sys.exit(f"no launch of {steps} steps after the first {skip}")
    total = 0.0
    for i, (line, _) in enumerate(launches[0]):
        ns = statistics.median(l[i][1] for l in launches) / ghz
        total += ns
        print(f"{i:2d}  line {line:5d}  {ns:7.0f} ns")
    print(f"sum {total:.0f} ns over {len(launches)} launches")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("patch")
    p.add_argument("src")
    p.add_argument("dst")
    r = sub.add_parser("report")
    r.add_argument("log")
    r.add_argument("--steps", type=int, required=True, help="steps of the launches to report")
    r.add_argument("--skip", type=int, default=0, help="launches of those steps to skip first")
    r.add_argument("--ghz", type=float, default=1.86, help="SM clock while decoding")
    a = ap.parse_args()
    if a.cmd == "patch":
        patch(a.src, a.dst)
    else:
        report(a.log, a.steps, a.skip, a.ghz)


if __name__ == "__main__":
    main()
