#!/usr/bin/env python3
"""The dispatcher's own CPU for one `dispatcher local` run over a folder, for side-by-side runs of
two builds on the developer machine (docs/benchmarks.md, session 30).

Usage: python3 scripts/bench/dispatcher_cpu.py BIN_DIR INPUT_DIR [MODEL]
BIN_DIR holds `dispatcher` and `worker`; MODEL defaults to the checked-in fixture model. Each run
gets new spool and store folders under /tmp/dispatcher-cpu-runs/ (nothing is deleted: on ext4
without a journal, deleting the last run's files slows the next run's, docs/operations.md).
Prints user and system seconds and minor page faults of the dispatcher process alone (not its
workers), read from /proc/PID/stat every 50 ms until it exits, with 2 CPU workers.
"""
import os
import subprocess
import sys
import time
import uuid

tick = os.sysconf("SC_CLK_TCK")
bin_dir, input_dir = sys.argv[1], sys.argv[2]
model = sys.argv[3] if len(sys.argv) > 3 else "models/tests/fixtures/tdt-real-options/model.nemo"
run = f"/tmp/dispatcher-cpu-runs/{uuid.uuid4().hex}"
cmd = [f"{bin_dir}/dispatcher", "local", "--spool", f"{run}/spool", "--store", f"{run}/store",
       "--input-dir", input_dir, "--model", model, "--cpu-instances", "2",
       "--worker-binary", f"{bin_dir}/worker"]
proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
user = system = 0.0
faults = 0
while proc.poll() is None:
    try:
        # Fields after the command name: minflt is the 8th, utime and stime the 12th and 13th.
        f = open(f"/proc/{proc.pid}/stat").read().rsplit(")", 1)[1].split()
        user, system, faults = int(f[11]) / tick, int(f[12]) / tick, int(f[7])
    except (OSError, IndexError, ValueError):
        pass
    time.sleep(0.05)
print(f"{bin_dir} {os.path.basename(os.path.normpath(input_dir))} rc={proc.returncode} "
      f"user={user:.2f} sys={system:.2f} total={user + system:.2f} minflt={faults}")
