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

`patch --blocks K` traces thread 0 of every block instead, and prints every block's means
("TRACEB" lines) for its K-th launch that starts with 16 active rows (per build). `skew` then
shows how the points spread over the blocks: a block whose waits for other blocks' values are
the shortest is the one the others wait for.

  python3 scripts/bench/decoder_trace.py patch --blocks 10 worker/cuda/kernels/decoder.cu /tmp/t.cu
  python3 scripts/bench/decoder_trace.py skew bench.log --build bf16 [--ghz 1.86]
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
    ("        // KEY_LANES lanes per row", "        TRACE();\n", ""),
    ("        const unsigned now = clock + (unsigned)step;",
     "        if (blockIdx.x == 0 && threadIdx.x == 0) {\n"
     "            trace_n = 0;\n            trace_last = trace_clock();\n        }\n", ""),
    ("        PROFILE_MARK(5);", "", STEP_END),
    ("    int step = 0;", "", ""),
    ("    __syncthreads();  // every thread's cells are written", "", ""),
] + [(f"PROFILE_MARK({i});", "", " TRACE();") for i in range(5)]


# Every block's thread 0 (`--blocks K`): the launch count per block, and the K-th launch with
# 16 active rows printed by every block.
BLOCKS_HEADER = """
__device__ int trace_launches[4096];
#ifdef CUDA_ENGINE_F32_STORAGE
#define TRACE_BUILD "f32"
#else
#define TRACE_BUILD "bf16"
#endif
"""

BLOCKS_LAUNCH_START = """    int trace_launch = -1;
    if (threadIdx.x == 0) {
        trace_count = 0;
        int active = 0;
        for (int row = 0; row < p.rows; ++row) active += row_active(srs + row * RS_FIELDS);
        if (active == 16) trace_launch = trace_launches[blockIdx.x]++;
    }
    __syncthreads();
    int step = 0;"""

BLOCKS_LAUNCH_END = """    if (threadIdx.x == 0 && trace_launch == TRACE_LAUNCH && step > 0) {
        const unsigned long long n = trace_acc[TRACE_MAX - 1];
        unsigned smid;
        asm("mov.u32 %0, %%smid;" : "=r"(smid));
        for (int i = 0; i < trace_count && i < TRACE_MAX - 1; ++i)
            printf("TRACEB %s blk %d smid %u steps %d predicting %llu pt %d line %d cycles %.0f\\n",
                   TRACE_BUILD, (int)blockIdx.x, smid, step, n, i, trace_line[i],
                   (double)trace_acc[i] / (double)(n ? n : 1));
    }
    __syncthreads();  // every thread's cells are written"""


def patch(src, dst, blocks=None):
    text = open(src).read()
    start, end = LAUNCH_START, LAUNCH_END
    edits = EDITS
    if blocks is not None:
        start, end = BLOCKS_LAUNCH_START, BLOCKS_LAUNCH_END
        every = lambda t: t.replace("blockIdx.x == 0 && threadIdx.x == 0", "threadIdx.x == 0")
        header = f"#define TRACE_LAUNCH {blocks}\n" + BLOCKS_HEADER + every(HEADER)
        edits = [(a, every(header) if a == "struct TdtParams {" else every(b), every(c))
                 for a, b, c in EDITS]
    for anchor, before, after in edits:
        if text.count(anchor) != 1:
            sys.exit(f"anchor not found exactly once: {anchor!r}")
        if anchor == "    int step = 0;":
            text = text.replace(anchor, start)
        elif anchor.startswith("    __syncthreads();  // every thread's cells"):
            text = text.replace(anchor, end)
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


def skew(log, build, ghz):
    """Per trace point, how its mean over the predicting steps spreads over the blocks (ns),
    and the blocks at both ends."""
    points = {}  # point -> (line, [(value, block, smid)])
    for line in open(log, errors="replace"):
        m = re.match(r"TRACEB (\S+) blk (\d+) smid (\d+) steps \d+ predicting \d+ pt (\d+) "
                     r"line (\d+) cycles (\d+)", line)
        if not m or m[1] != build:
            continue
        blk, smid, pt, src, cycles = (int(m[i]) for i in range(2, 7))
        points.setdefault(pt, (src, []))[1].append((cycles / ghz, blk, smid))
    if not points:
        sys.exit(f"no TRACEB lines of the {build} build")
    print(f"{'pt':>2} {'line':>5} {'min':>6} {'p10':>6} {'median':>6} {'p90':>6} {'max':>6}"
          "  lowest (block/sm)          highest (block/sm)")
    totals = {}
    for pt in sorted(points):
        src, values = points[pt]
        values.sort()
        ns = [v for v, _, _ in values]
        q = lambda f: ns[min(len(ns) - 1, int(f * len(ns)))]
        ends = lambda vs: " ".join(f"{b}/{s}" for _, b, s in vs)
        print(f"{pt:2d} {src:5d} {ns[0]:6.0f} {q(0.1):6.0f} {statistics.median(ns):6.0f} "
              f"{q(0.9):6.0f} {ns[-1]:6.0f}  {ends(values[:3]):26s}  {ends(values[-3:])}")
        for v, b, _ in values:
            totals[b] = totals.get(b, 0.0) + v
    sums = sorted(totals.values())
    print(f"step per block: min {sums[0]:.0f} median {statistics.median(sums):.0f} "
          f"max {sums[-1]:.0f} ns over {len(sums)} blocks")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("patch")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--blocks", type=int, help="trace every block; print its K-th 16-row launch")
    r = sub.add_parser("report")
    r.add_argument("log")
    r.add_argument("--steps", type=int, required=True, help="steps of the launches to report")
    r.add_argument("--skip", type=int, default=0, help="launches of those steps to skip first")
    r.add_argument("--ghz", type=float, default=1.86, help="SM clock while decoding")
    k = sub.add_parser("skew")
    k.add_argument("log")
    k.add_argument("--build", default="bf16", choices=["bf16", "f32"])
    k.add_argument("--ghz", type=float, default=1.86, help="SM clock while decoding")
    a = ap.parse_args()
    if a.cmd == "patch":
        patch(a.src, a.dst, a.blocks)
    elif a.cmd == "skew":
        skew(a.log, a.build, a.ghz)
    else:
        report(a.log, a.steps, a.skip, a.ghz)


if __name__ == "__main__":
    main()
