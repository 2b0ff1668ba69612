#!/usr/bin/env python3
"""The dispatcher's own CPU and memory for one `dispatcher local` run over a folder, or one
`dispatcher run --exit-when-idle` over a queue, for side-by-side runs of two builds on the
developer machine (docs/benchmarks.md, sessions 30 and 37).

Usage: python3 scripts/bench/dispatcher_cpu.py BIN_DIR INPUT_DIR [MODEL]
       python3 scripts/bench/dispatcher_cpu.py BIN_DIR --queue-url URL --output-uri URI [MODEL]
BIN_DIR holds `dispatcher` and `worker`; MODEL defaults to the checked-in fixture model. A local
run gets new spool and store folders under /tmp/dispatcher-cpu-runs/ (nothing is deleted: on
ext4 without a journal, deleting the last run's files slows the next run's,
docs/operations.md). A queue run takes its endpoints and keys from the AWS_* variables (fill
the queue first with `dispatcher backfill`). Prints user and system seconds, minor page faults
and peak resident memory (VmHWM) of the dispatcher process alone (not its workers), read from
/proc/PID every 50 ms until it exits, with 2 CPU workers.
"""
import argparse
import os
import subprocess
import time
import uuid

parser = argparse.ArgumentParser()
parser.add_argument("bin_dir")
parser.add_argument("input_dir", nargs="?")
parser.add_argument("model", nargs="?", default="models/tests/fixtures/tdt-real-options/model.nemo")
parser.add_argument("--queue-url")
parser.add_argument("--output-uri")
args = parser.parse_args()
if (args.input_dir is None) == (args.queue_url is None):
    parser.error("give either INPUT_DIR or --queue-url (with --output-uri)")

tick = os.sysconf("SC_CLK_TCK")
common = ["--model", args.model, "--cpu-instances", "2", "--worker-binary", f"{args.bin_dir}/worker"]
if args.queue_url:
    if not args.output_uri:
        parser.error("--queue-url needs --output-uri")
    what = args.queue_url.rsplit("/", 1)[-1]
    cmd = [f"{args.bin_dir}/dispatcher", "run", "--queue-url", args.queue_url,
           "--output-uri", args.output_uri, "--s3-force-path-style", "--exit-when-idle"] + common
else:
    what = os.path.basename(os.path.normpath(args.input_dir))
    run = f"/tmp/dispatcher-cpu-runs/{uuid.uuid4().hex}"
    cmd = [f"{args.bin_dir}/dispatcher", "local", "--spool", f"{run}/spool", "--store",
           f"{run}/store", "--input-dir", args.input_dir] + common
proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
user = system = 0.0
faults = peak_kib = 0
while proc.poll() is None:
    try:
        # Fields after the command name: minflt is the 8th, utime and stime the 12th and 13th.
        f = open(f"/proc/{proc.pid}/stat").read().rsplit(")", 1)[1].split()
        user, system, faults = int(f[11]) / tick, int(f[12]) / tick, int(f[7])
        for line in open(f"/proc/{proc.pid}/status"):
            if line.startswith("VmHWM:"):
                peak_kib = int(line.split()[1])
    except (OSError, IndexError, ValueError):
        pass
    time.sleep(0.05)
print(f"{args.bin_dir} {what} rc={proc.returncode} user={user:.2f} sys={system:.2f} "
      f"total={user + system:.2f} minflt={faults} peak_rss_mib={peak_kib // 1024}")
