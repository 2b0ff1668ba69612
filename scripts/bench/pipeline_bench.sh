#!/usr/bin/env bash
# The main job end to end on the GPU machine: recordings in, transcripts out, with
# `dispatcher local --gpus 0`, beside the offline engine benchmark on the same audio (the
# ceiling), in one call. From the repository root, with
#   .bench-corpus/   from scripts/bench/make_pipeline_corpus.sh (made on the developer machine)
#   .device-pipeline/bins.tar.xz: dispatcher, worker, offline_bench, sla_sweep, libopus, libsoxr
#                    (scripts/bench/build_pipeline_bins.sh), unpacked into $BIN
#                    (default /tmp/pipeline-bin)
# Writes under ${OUT:-/tmp/pipeline}: results.jsonl (one line per run), the runs' logs, and
# gpu-*.csv (GPU utilisation sampled every 200 ms during each run); with TARBALL=PATH, all of it
# packed into one file at the end (the device tool brings back few files).
#
# Steps (STEPS=..., default "model corpus offline default"):
#   model    the calibrated full-size random Parakeet (scripts/device/gpu_fleet_drill.sh model)
#   corpus   copies the seed recordings under new names until the mix holds HOURS (default 23)
#            hours of 5-60 s recordings, plus LONG_COPIES (default 4) copies of each long one
#   offline  the offline engine benchmark (offline_bench, batch 16, length-sorted) on the
#            16 kHz versions of the same clips: the ceiling
#   default  `dispatcher local --gpus 0` and nothing else (the defaults)
#   cut30    the whole mix with --max-segment-s 30 (the default before one pass per recording)
#   graph60  the whole mix with the workers' decoder graphs captured up to 60 s segments
#   short    the 5-60 s recordings alone (no long ones), one pass and --max-segment-s 30
#   before   the settings the main job had before sizing (4 workers, 4 jobs in flight, one in
#            inference, 8 segments per call, spinning GPU waits), for comparison
#   single   --instances-per-gpu 1 (one worker, MPS at 100 %)
#   spin     the defaults with spinning GPU waits (--worker-arg=--cuda-sync=spin)
#            (before, single and spin run on 30 % of the mix, beside the defaults on the same
#            part, as run default-quarter when default is a step)
#   layouts  the whole mix with one worker (--instances-per-gpu 1), with 2 and with 4 under MPS
#            (--instances-per-gpu 2, 4), beside the default
#   threads  the layouts of `layouts` with DECODE_THREADS (default "24 32") decode threads
#   tune     runs of the whole mix with other settings: TUNE="name:args;name:args", each run
#            named tune-NAME with ARGS added to the defaults (words split on spaces)
#   formats  host CPU per format: one run per format's recordings (and one with none, whose
#            CPU, the fleet's start and stop, is subtracted, as are the workers' model loads);
#            FORMATS picks the formats (default "wav flac mp3 opus_ogg m4a")
#   sla      the seed article's SLA sweep (worker/fleet/examples/sla_sweep.rs) on the 5/15/30/
#            45/60 s clips: layouts single, timeslice4, mps2, mps4, mps8 (SLA_LAYOUTS), closed
#            loop at SLA_CONCURRENCY, SLA_ROUNDS rounds of SLA_LEVEL_S s; writes sla.csv (plot it
#            on the developer machine with the sla_plot example)
#   api      the same sweep through the OpenAI-compatible HTTP API: `dispatcher serve --gpus 0`
#            (API_SERVE_ARGS, default --instances-per-gpu 4) on 127.0.0.1:8000,
#            each request a clip's WAV posted as OpenAI's client posts it (sla_sweep --layouts
#            api, levels API_CONCURRENCY); writes api.csv
#   api-backfill  the same while that server also works through the corpus as a backfill on
#            the same fleet (--spool/--store/--input-dir); writes api-backfill.csv
#   moto     the main job on SQS and S3: a moto_server on 127.0.0.1 (carried packed in
#            .device-moto/, from scripts/bench/moto_site.sh), the corpus uploaded to a bucket, one
#            job per recording (`dispatcher backfill`), then `dispatcher run --gpus 0
#            --exit-when-idle` and nothing else; run moto-default, beside `local` on the same
#            corpus (run default, or run moto-local-same when MOTO_CORPUS names a smaller folder:
#            moto serves a few hundred requests per second); MOTO_LONG_COPIES=N instead makes
#            the moto corpus N copies of each 10-minute seed recording (about 10 requests per
#            recording whatever its length, so moto stops being the limit)
#   doubles  the same on the whole corpus through faster local doubles (moto also slows with
#            its queue's length: 1 000 jobs take 30 s to enqueue, 11 158 would take hours):
#            SQS from fakecloud (in memory, from crates.io) and S3 from each of DOUBLES_S3
#            (default "s3-memory"): s3-memory (scripts/bench/s3-memory: the corpus read into
#            memory, the protocol from the s3s crate) and s3s-fs (from crates.io; objects are
#            files, the corpus linked into its folder; its answers queue under hundreds of jobs
#            in flight, and it walks the whole bucket for every page of a listing), all on
#            127.0.0.1, packed in .device-moto/ by scripts/bench/doubles_bins.sh; per S3 double,
#            `dispatcher backfill`, then `dispatcher run --gpus 0 --exit-when-idle` as run run-S3
#            (the result manifests counted through ListObjectsV2, s3s-fs's on disk); S3_LATENCY_MS=N
#            delays each of s3-memory's answers by N ms (S3's own time is tens of ms);
#            DOUBLES_TUNE="name:args;..." adds runs with other flags (run-S3-NAME, each on its own
#            queue and output prefix), e.g. "mif1088:--max-in-flight 1088"
# Every run's host CPU is the user + system time of the dispatcher and everything it waited for
# (its workers); its wall and audio-s/s come from the dispatcher's closing table, which times
# from the fleet being ready (its start excluded) to the last job's end.
set -uo pipefail
OUT=${OUT:-/tmp/pipeline}
BIN=${BIN:-/tmp/pipeline-bin}
STEPS=${STEPS:-model corpus offline default}
MODEL=${MODEL:-/tmp/parakeet-random.nemo}
HOURS=${HOURS:-23}
LONG_COPIES=${LONG_COPIES:-4}
DOUBLES_S3=${DOUBLES_S3:-s3-memory}
CORPUS=${CORPUS:-/tmp/pipeline-corpus}
# Where each run's spool and store live (SCRATCH=/dev/shm: in memory, without the file system's
# cost per job, for comparison): new folders per run under $RUNS, never deleted here. This
# machine's root is ext4 without a journal, where each file created in the minutes after files
# were deleted (1-6 minutes: the kernel's RECENTCY_MIN and RECENTCY_DIRTY) is allocated past
# every inode deleted since: deleting one run's store (some 100 000 files for the 96 h corpus)
# would slow every file the next run writes, and the next run would pay for this script's
# housekeeping. (That is what made system time per job grow from run to run before.)
SCRATCH=${SCRATCH:-/tmp}
RUNS=$SCRATCH/pipeline-runs/$(date +%s)
SEED=${SEED:-$PWD/.bench-corpus}
mkdir -p "$OUT" "$BIN"
if [ ! -x "$BIN/dispatcher" ]; then
  xz -dc .device-pipeline/bins.tar.xz | tar -C "$BIN" -xf - || exit 1
fi
export LD_LIBRARY_PATH="$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
has() { [[ " $STEPS " == *" $1 "* ]]; }
# The host's CPU model too: its cores decide what the compressed formats cost (docs/operations.md).
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; nproc
  grep -m1 "model name" /proc/cpuinfo; findmnt -no SOURCE,FSTYPE,OPTIONS -T "$SCRATCH"; } | tee "$OUT/machine.txt"

if has model; then
  OUT=$OUT/drill MODEL=$MODEL STEPS=model BIN=$BIN bash scripts/device/gpu_fleet_drill.sh >/dev/null 2>&1
  ls -la "$MODEL" || exit 1
fi

if has corpus; then
  rm -rf "$CORPUS"; mkdir -p "$CORPUS"
  python3 - "$SEED" "$CORPUS" "$HOURS" "$LONG_COPIES" <<'PY'
import os, shutil, sys, wave
seed, out, hours, long_copies = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
def secs(name):
    # clip45s.mp3 -> 45; ref16k WAVs are the wav format of the same clips
    return float(name.split("s", 1)[0].removeprefix("clip"))
short = [(os.path.join(seed, "seed", f), f) for f in sorted(os.listdir(f"{seed}/seed")) if f.startswith("clip")]
short += [(os.path.join(seed, "ref16k", f), f) for f in sorted(os.listdir(f"{seed}/ref16k"))]
per_round = sum(secs(f) for _, f in short)
rounds = max(1, round(hours * 3600 / per_round))
total = 0.0
for r in range(rounds):
    for path, name in short:
        fmt = name.split(".", 1)[1].replace(".", "_")
        os.makedirs(f"{out}/{fmt}", exist_ok=True)
        os.link(path, f"{out}/{fmt}/r{r:04d}_{name}")
        total += secs(name)
for path in sorted(os.listdir(f"{seed}/seed")):
    if path.startswith("long"):
        fmt = "long"
        os.makedirs(f"{out}/{fmt}", exist_ok=True)
        for c in range(long_copies):
            os.link(f"{seed}/seed/{path}", f"{out}/{fmt}/c{c}_{path}")
            total += 600
n = sum(len(files) for _, _, files in os.walk(out))
print(f"corpus: {n} recordings, {total/3600:.2f} h of audio, {rounds} rounds of the seed clips")
PY
  du -sh "$CORPUS"; ls "$CORPUS"
fi

if has offline; then
  # Each distinct 16 kHz clip as often as in the corpus' mix (20 copies: 100 clips, 1 h).
  python3 - "$SEED" > /tmp/offline.jsonl <<'PY'
import json, os, sys
d = f"{sys.argv[1]}/ref16k"
for r in range(20):
    for f in sorted(os.listdir(d)):
        print(json.dumps({"path": f"{d}/{f}"}))
PY
  for run in 1 2; do
    OFFLINE_MODEL=$MODEL OFFLINE_MANIFEST=/tmp/offline.jsonl OFFLINE_OUT=/tmp/offline_out.jsonl \
      OFFLINE_BATCH=16 REQUIRE_CUDA=1 timeout 300 "$BIN/offline_bench" --ignored --nocapture 2>&1 \
      | grep RESULT | sed "s/^/offline run $run: /" | tee -a "$OUT/offline.txt"
  done
fi

# run NAME INPUT_DIR [dispatcher flags...]: one `dispatcher local` over INPUT_DIR.
run() {
  local name=$1 input=$2; shift 2
  local dir=$RUNS/$name
  mkdir -p "$dir"; rm -rf "/tmp/fleet-$name"
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader,nounits -lms 200 \
    > "$OUT/gpu-$name.csv" 2>/dev/null &
  local smi=$!
  # RUN_COMMAND: another subcommand than `local` on INPUT_DIR (its words, split on spaces).
  local command
  # shellcheck disable=SC2206 # RUN_COMMAND is a list of words
  command=(${RUN_COMMAND:-local --spool "$dir/spool" --store "$dir/store" --input-dir "$input" \
    --progress-interval-s 5})
  python3 - "$OUT" "$name" "$BIN/dispatcher" "${command[@]}" --model "$MODEL" --gpus 0 \
    --runtime-dir "/tmp/fleet-$name" "$@" <<'PY'
import datetime, json, os, re, resource, subprocess, sys, time
out, name, cmd = sys.argv[1], sys.argv[2], sys.argv[3:]
started = time.time()
tick = os.sysconf("SC_CLK_TCK")
own_cpu_s = own_sys_s = 0.0

def machine_busy_s():
    # Every process's time, the MPS daemon's and server's included (not the dispatcher's
    # children): user, nice, system, irq, softirq, steal of /proc/stat's first line.
    f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return (f[0] + f[1] + f[2] + f[5] + f[6] + f[7]) / tick

def stat_fields(path):
    text = open(path).read()
    comm = text[text.index("(") + 1:text.rindex(")")]
    return comm, text.rsplit(")", 1)[1].split()

def descendants(pid):
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for t in os.listdir(f"/proc/{p}/task"):
            try:
                todo += [int(c) for c in open(f"/proc/{p}/task/{t}/children").read().split()]
            except OSError:
                pass
    return out

# CPU seconds per thread of the dispatcher and its descendants (latest reading per thread):
# which threads the host's time goes to.
threads = {}
# Largest resident set (VmHWM) of any one process, per process name.
peak_rss_mib = {}
# What the dispatcher's threads were doing at each sample, per thread name: running (R), or
# the system call a sleeping one was blocked in (futex: a lock or a wait for work; read,
# fsync, openat...: files; epoll_wait: the async runtime idle). Where off-CPU time goes.
SYSCALLS = {"0": "read", "1": "write", "3": "close", "7": "poll", "9": "mmap", "11": "munmap",
            "17": "pread64", "23": "select", "28": "madvise", "74": "fsync", "75": "fdatasync",
            "82": "rename", "202": "futex", "230": "clock_nanosleep", "232": "epoll_wait",
            "257": "openat", "262": "newfstatat", "281": "epoll_pwait", "332": "statx"}
thread_states = {}
def sample_states(pid):
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            comm, f = stat_fields(f"/proc/{pid}/task/{t}/stat")
            state = f[0]
            if state in "SD":
                nr = open(f"/proc/{pid}/task/{t}/syscall").read().split()[0]
                state += ":" + SYSCALLS.get(nr, nr)
            key = f"{re.sub(r'[-_ ]?[0-9]+$', '', comm)} {state}"
            thread_states[key] = thread_states.get(key, 0) + 1
        except (OSError, ValueError, IndexError):
            pass

def sample_threads(root):
    sample_states(root)
    for p in descendants(root):
        try:
            pcomm, _ = stat_fields(f"/proc/{p}/stat")
            hwm = [l for l in open(f"/proc/{p}/status") if l.startswith("VmHWM:")]
            if hwm:
                mib = int(hwm[0].split()[1]) // 1024
                peak_rss_mib[pcomm] = max(peak_rss_mib.get(pcomm, 0), mib)
            for t in os.listdir(f"/proc/{p}/task"):
                comm, f = stat_fields(f"/proc/{p}/task/{t}/stat")
                threads[(p, int(t))] = (pcomm, comm, (int(f[11]) + int(f[12])) / tick)
        except (OSError, ValueError, IndexError):
            pass

machine_before = machine_busy_s()
samples = 0
with open(f"{out}/{name}.log", "w") as log:
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    while proc.poll() is None:
        # The dispatcher's own user + system time (fields 14, 15 of /proc/PID/stat): the rest
        # of the children's total is its workers'.
        try:
            fields = open(f"/proc/{proc.pid}/stat").read().rsplit(")", 1)[1].split()
            own_cpu_s = (int(fields[11]) + int(fields[12])) / tick
            own_sys_s = int(fields[12]) / tick
            sample_threads(proc.pid)
            samples += 1
        except (OSError, IndexError, ValueError):
            pass
        time.sleep(0.2)
    rc = proc.returncode
elapsed = time.time() - started
machine_cpu_s = machine_busy_s() - machine_before
by_thread = {}
for pcomm, comm, cpu in threads.values():
    # Numbered threads as one name: pool threads (decode-3 -> decode), one per worker
    # connection (fleet-3-writer -> fleet-N-writer).
    key = f"{pcomm}/{re.sub(r'[0-9]+', 'N', re.sub(r'[-_ ]?[0-9]+$', '', comm))}"
    by_thread[key] = by_thread.get(key, 0.0) + cpu
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
text = open(f"{out}/{name}.log").read()
text = re.sub(r"\x1b\[[0-9;]*m", "", text)
m = re.search(r"wall ([0-9.]+) s · audio ([0-9.]+) s · ([0-9]+) audio-s/s", text)
stages = {s: float(v) for s, v in re.findall(r"stage (\w+)\s+\d+ jobs\s+([0-9.]+) s total", text)}
jobs = re.search(r"^done (\d+) · already done \d+ · failed (\d+)", text, re.M)
layout = re.search(r'layout=([^=]*?) diarization', text)
limits = re.search(r"receivers=(\d+) max_in_flight=(\d+) inference_slots=(\d+) segments_per_call=(\d+) decode_threads=(\d+)", text)
# The rate once every worker is ready: the fleet starts its workers one after another (the
# load lock), and the consumer starts with the first, so a short run's figure includes the
# others' start. Each job's end is its manifest's mtime; the audio of the jobs that end after
# the last worker is ready, over the time from then to the last job's end (the jobs in flight
# at that moment had some of their work done before it: at most max_in_flight of them).
after_ready = None
ready = [datetime.datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp()
         for t in re.findall(r"^(\S+Z)\s+INFO worker_fleet::fleet::supervise: worker ready", text, re.M)]
if "--store" in cmd and ready:
    ends = []
    for root, _, files in os.walk(os.path.join(cmd[cmd.index("--store") + 1], "results")):
        if "manifest.json" in files:
            path = os.path.join(root, "manifest.json")
            ends.append((os.path.getmtime(path), json.load(open(path))["audio_duration_s"]))
    last_ready, last_end = max(ready), max((e for e, _ in ends), default=0.0)
    audio = sum(a for e, a in ends if e > last_ready)
    if last_end > last_ready:
        after_ready = {"workers": len(ready), "first_to_last_ready_s": round(last_ready - min(ready), 2),
                       "span_s": round(last_end - last_ready, 2), "audio_s": round(audio, 1),
                       "audio_s_per_s": round(audio / (last_end - last_ready))}
row = {
    "run": name, "rc": rc, "process_s": round(elapsed, 2),
    "wall_s": float(m.group(1)) if m else None,
    "audio_s": float(m.group(2)) if m else None,
    "audio_s_per_s": int(m.group(3)) if m else None,
    "host_cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
    "dispatcher_cpu_s": round(own_cpu_s, 2),
    "dispatcher_sys_s": round(own_sys_s, 2),
    "machine_cpu_s": round(machine_cpu_s, 2),
    "peak_rss_mib": peak_rss_mib,
    "threads_cpu_s": {k: round(v, 2) for k, v in sorted(by_thread.items(), key=lambda kv: -kv[1]) if v >= 0.05},
    "done": int(jobs.group(1)) if jobs else None, "failed": int(jobs.group(2)) if jobs else None,
    "layout": layout.group(1).strip() if layout else None,
    "limits": limits.groups() if limits else None,
    "stages_s": stages,
    # The closing report's verdict on what set the pace (decoding, the engine, the store).
    "limit": (re.search(r"^limit: .*$", text, re.M) or [None])[0],
    "after_all_ready": after_ready,
    # Mean threads per (name, state) over the samples (one each 200 ms).
    "thread_states": {k: round(v / max(1, samples), 2) for k, v in
                      sorted(thread_states.items(), key=lambda kv: -kv[1]) if v / max(1, samples) >= 0.1},
}
print(json.dumps(row))
with open(f"{out}/results.jsonl", "a") as f:
    f.write(json.dumps(row) + "\n")
PY
  kill $smi 2>/dev/null; wait $smi 2>/dev/null
  python3 - "$OUT/gpu-$name.csv" <<'PY'
import sys
rows = [l.split(",") for l in open(sys.argv[1]) if l.strip()]
util = [float(r[0]) for r in rows if r[0].strip().replace(".", "").isdigit()]
busy = [u for u in util if u > 0]
print(f"  gpu utilisation: mean {sum(util)/max(1,len(util)):.0f} % over {len(util)} samples, "
      f"mean {sum(busy)/max(1,len(busy)):.0f} % while busy; memory max {max((float(r[1]) for r in rows), default=0):.0f} MiB")
PY
  grep -E "^progress:|workers per GPU chosen|pipeline limits|^limit:" "$OUT/$name.log" | tail -5 | sed 's/\x1b\[[0-9;]*m//g'
}

has default && run default "$CORPUS"
# The old default beside it: recordings cut at quiet points into pieces of at most 30 s.
has cut30 && run cut30 "$CORPUS" --max-segment-s 30
# The 5-60 s recordings alone (no long ones), one pass and cut at 30 s.
if has short; then
  rm -rf "$CORPUS-short"; mkdir -p "$CORPUS-short"
  (cd "$CORPUS" && for d in *; do [ "$d" = long ] || cp -al "$d" "$CORPUS-short/$d"; done)
  run short-default "$CORPUS-short"
  run short-cut30 "$CORPUS-short" --max-segment-s 30
fi
# One pass with the workers' decoder graphs captured up to 60 s segments (default 30 s).
has graph60 && run graph60 "$CORPUS" --worker-arg=--cuda-graph-max-s=60
has layouts && run one-worker "$CORPUS" --instances-per-gpu 1
has layouts && run mps2 "$CORPUS" --instances-per-gpu 2
has layouts && run mps4 "$CORPUS" --instances-per-gpu 4
# The decode pool's size against the layouts (DECODE_THREADS, default "24 32").
if has threads; then
  for n in ${DECODE_THREADS:-24 32}; do
    run "mps4-threads$n" "$CORPUS" --instances-per-gpu 4 --decode-threads "$n"
    run "one-worker-threads$n" "$CORPUS" --instances-per-gpu 1 --decode-threads "$n"
  done
fi
# Settings tried against the defaults (TUNE="name:args;..."): what holds the rate.
if has tune; then
  IFS=';' read -ra tunes <<< "${TUNE:-}"
  for t in "${tunes[@]}"; do
    # shellcheck disable=SC2086 # the run's arguments are words
    run "tune-${t%%:*}" "$CORPUS" ${t#*:}
  done
fi
# The comparisons run on 30 % of the mix (the copies whose round ends in 0, 4 or 8).
if has before || has single || has spin; then
  rm -rf "$CORPUS-quarter"; mkdir -p "$CORPUS-quarter"
  (cd "$CORPUS" && for d in *; do mkdir -p "$CORPUS-quarter/$d"
     for f in "$d"/*; do case "$f" in */r*[048]_*|*/c0_*) ln "$f" "$CORPUS-quarter/$f";; esac; done; done)
fi
has before && run before "$CORPUS-quarter" --instances-per-gpu 4 --max-in-flight 4 \
  --inference-slots 1 --segments-per-call 8 --receivers 1 --worker-arg=--cuda-sync=spin
has single && run single "$CORPUS-quarter" --instances-per-gpu 1
has spin && run spin "$CORPUS-quarter" --worker-arg=--cuda-sync=spin
if has default && [ -d "$CORPUS-quarter" ]; then run default-quarter "$CORPUS-quarter"; fi

if has formats; then
  mkdir -p /tmp/empty-input
  run formats-none /tmp/empty-input
  for fmt in ${FORMATS:-wav flac mp3 opus_ogg m4a}; do
    run "formats-$fmt" "$CORPUS/$fmt"
  done
  python3 - "$OUT/results.jsonl" <<'PY' | tee "$OUT/formats.txt"
import json, sys
rows = {r["run"]: r for r in map(json.loads, open(sys.argv[1]))}
def beyond_load(r):
    # The workers' main threads load the model and then only accept connections: their time
    # is the fleet's start, whether a run lasted long enough for every load to finish or not.
    return r["host_cpu_s"] - r.get("threads_cpu_s", {}).get("worker/worker", 0.0)
base = beyond_load(rows["formats-none"]) if "formats-none" in rows else 0.0
for fmt in ["wav", "flac", "mp3", "opus_ogg", "m4a"]:
    r = rows.get(f"formats-{fmt}")
    if not r or not r["audio_s"]:
        continue
    cpu = beyond_load(r) - base
    print(f"{fmt}: {r['audio_s']:.0f} audio-s, host CPU {cpu:.1f} s beyond the fleet's start "
          f"and stop ({base:.1f} s): {r['audio_s']/cpu:.0f} audio-s per core-second; "
          f"decode stage {r['stages_s'].get('decode', 0):.1f} s, resample {r['stages_s'].get('resample', 0):.1f} s; "
          f"dispatcher {r['dispatcher_cpu_s']:.1f} s, of it system {r.get('dispatcher_sys_s', 0):.1f} s")
PY
fi

if has sla; then
  CLIPS=$(ls "$SEED"/ref16k/*.wav | paste -sd,)
  RUST_LOG=warn timeout 590 "$BIN/sla_sweep" --engine cuda --model "$MODEL" --clips "$CLIPS" \
    --gpus 0 --worker-binary "$BIN/worker" --runtime-dir /tmp/sla \
    --layouts "${SLA_LAYOUTS:-single,timeslice4,mps2,mps4,mps8}" \
    --concurrency "${SLA_CONCURRENCY:-1,4,16,32,64,100,128,160,192,256}" \
    --rounds "${SLA_ROUNDS:-2}" --level-s "${SLA_LEVEL_S:-2.5}" --warmup-s 0.5 \
    --out-csv "$OUT/sla.csv" > "$OUT/sla-summary.txt" 2> "$OUT/sla.log"
  echo "sla sweep exit $?"; tail -8 "$OUT/sla.log"; cat "$OUT/sla-summary.txt"
fi

# The API sweep, alone (step api) or while the same server works through the whole corpus as
# a backfill on the same fleet (step api-backfill: --spool/--store/--input-dir, the API's segments
# first); writes api.csv / api-backfill.csv.
api_sweep() {
  local name=$1; shift
  CLIPS=$(ls "$SEED"/ref16k/*.wav | paste -sd,)
  rm -rf /tmp/api-spool /tmp/api-store
  # shellcheck disable=SC2086 # API_SERVE_ARGS is a list of flags
  "$BIN/dispatcher" serve --listen 127.0.0.1:8000 --model "$MODEL" --gpus 0 \
    --worker-binary "$BIN/worker" ${API_SERVE_ARGS:---instances-per-gpu 4} "$@" \
    > "$OUT/$name-serve.log" 2>&1 &
  serve_pid=$!
  started=$(date +%s%N)
  until curl -sf -o /dev/null http://127.0.0.1:8000/health; do
    kill -0 "$serve_pid" 2>/dev/null || { echo "serve exited"; tail -20 "$OUT/$name-serve.log"; return; }
    sleep 0.2
  done
  echo "$name: ready after $(( ($(date +%s%N) - started) / 1000000 )) ms"
  RUST_LOG=warn timeout 400 "$BIN/sla_sweep" --model "$MODEL" --clips "$CLIPS" --layouts api \
    --api-url http://127.0.0.1:8000 \
    --concurrency "${API_CONCURRENCY:-1,4,16,32,64,100,128,160,192,256}" \
    --rounds "${SLA_ROUNDS:-2}" --level-s "${SLA_LEVEL_S:-2.5}" --warmup-s 0.5 \
    --out-csv "$OUT/$name.csv" > "$OUT/$name-summary.txt" 2> "$OUT/$name.log"
  echo "$name sweep exit $?"; tail -3 "$OUT/$name.log"; cat "$OUT/$name-summary.txt"
  curl -s http://127.0.0.1:8000/metrics | grep -E '^dispatcher_(api_request|jobs|audio_seconds)' | grep -v bucket
  kill -TERM "$serve_pid"; wait "$serve_pid"; echo "$name: serve exit $?"
}
has api && api_sweep api
has api-backfill && api_sweep api-backfill --spool /tmp/api-spool --store /tmp/api-store \
  --input-dir "$CORPUS"

if has moto; then
  rm -rf /tmp/moto-site; xz -dc .device-moto/moto-site.tar.xz | tar -C /tmp -xf - || exit 1
  MOTO_PORT=5055
  PYTHONPATH=/tmp/moto-site python3 -m moto.server -H 127.0.0.1 -p $MOTO_PORT > "$OUT/moto.log" 2>&1 &
  moto_pid=$!
  for _ in $(seq 150); do
    curl -sf -o /dev/null "http://127.0.0.1:$MOTO_PORT/moto-api/" && break
    sleep 0.2
  done
  export AWS_ENDPOINT_URL=http://127.0.0.1:$MOTO_PORT AWS_ACCESS_KEY_ID=bench \
    AWS_SECRET_ACCESS_KEY=bench AWS_REGION=us-east-1 AWS_DEFAULT_REGION=us-east-1 \
    AWS_EC2_METADATA_DISABLED=true
  # The corpus into s3://bench-in/corpus/ (16 threads), the queue, then one job per recording.
  moto_corpus=${MOTO_CORPUS:-$CORPUS}
  if [ -n "${MOTO_LONG_COPIES:-}" ]; then
    moto_corpus=$CORPUS-motolong
    rm -rf "$moto_corpus"; mkdir -p "$moto_corpus/long"
    for f in "$SEED"/seed/long*; do
      for c in $(seq "$MOTO_LONG_COPIES"); do ln "$f" "$moto_corpus/long/m${c}_$(basename "$f")"; done
    done
    echo "moto corpus: $(ls "$moto_corpus/long" | wc -l) recordings of 10 minutes"
  fi
  queue_url=$(PYTHONPATH=/tmp/moto-site python3 - "$moto_corpus" <<'PY'
import os, sys, boto3
from concurrent.futures import ThreadPoolExecutor
root = sys.argv[1]
s3 = boto3.client("s3")
for b in ("bench-in", "bench-out"):
    s3.create_bucket(Bucket=b)
files = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]
def put(path):
    s3.upload_file(path, "bench-in", "corpus/" + os.path.relpath(path, root))
with ThreadPoolExecutor(16) as pool:
    list(pool.map(put, files))
print(boto3.client("sqs").create_queue(QueueName="bench-jobs")["QueueUrl"])
PY
)
  echo "moto: queue $queue_url"
  "$BIN/dispatcher" backfill s3://bench-in/corpus/ --queue-url "$queue_url" \
    --output-uri s3://bench-out/results/ --model "$MODEL" --s3-force-path-style 2>&1 | tail -2
  RUN_COMMAND="run --queue-url $queue_url --output-uri s3://bench-out/results/ \
    --s3-force-path-style --exit-when-idle" run moto-default "$moto_corpus"
  # moto answers from one Python process: its CPU beside the run's wall tells whether it was
  # the limit.
  echo "moto server CPU (upload, backfill and run): $(ps -o cputime= -p "$moto_pid")"
  kill "$moto_pid"; wait "$moto_pid" 2>/dev/null
  [ "$moto_corpus" != "$CORPUS" ] && run moto-local-same "$moto_corpus"
fi

if has doubles; then
  for d in fakecloud $DOUBLES_S3; do
    xz -dc ".device-moto/$d.xz" > "/tmp/$d" && chmod +x "/tmp/$d" || exit 1
  done
  s3_root=$RUNS/s3-root
  mkdir -p "$s3_root/bench-in" "$s3_root/bench-out"
  cp -al "$CORPUS" "$s3_root/bench-in/corpus"
  declare -A s3_port=([s3s-fs]=8014 [s3-memory]=8015) s3_pid=()
  for s3 in $DOUBLES_S3; do
    case $s3 in
      s3s-fs) /tmp/s3s-fs --host 127.0.0.1 --port 8014 --access-key bench --secret-key bench \
        "$s3_root" > "$OUT/s3s-fs.log" 2>&1 & ;;
      # Reads the corpus into memory before it listens (the wait below covers it).
      s3-memory) /tmp/s3-memory --port 8015 --access-key bench --secret-key bench \
        --preload "$s3_root" --latency-ms "${S3_LATENCY_MS:-0}" > "$OUT/s3-memory.log" 2>&1 & ;;
      *) echo "DOUBLES_S3: unknown double $s3 (s3s-fs, s3-memory)"; exit 1 ;;
    esac
    s3_pid[$s3]=$!
  done
  /tmp/fakecloud --addr 127.0.0.1:4566 --log-level warn > "$OUT/fakecloud.log" 2>&1 &
  sqs_pid=$!
  for s3 in $DOUBLES_S3; do
    for _ in $(seq 600); do curl -s -o /dev/null "http://127.0.0.1:${s3_port[$s3]}/" && break; sleep 0.1; done
  done
  for _ in $(seq 100); do curl -s -o /dev/null http://127.0.0.1:4566/ && break; sleep 0.1; done
  cat "$OUT/s3-memory.log" 2>/dev/null
  # fakecloud for everything but S3 (the run's CloudWatch metrics too); the S3 doubles check
  # signatures against these keys.
  export AWS_ENDPOINT_URL=http://127.0.0.1:4566 AWS_ACCESS_KEY_ID=bench \
    AWS_SECRET_ACCESS_KEY=bench AWS_REGION=us-east-1 AWS_EC2_METADATA_DISABLED=true
  # manifests NAME: result manifests under s3://bench-out/NAME/, counted through ListObjectsV2
  # (curl signs the query as written, so its parameters go in sorted order).
  manifests() {
    local token="" n=0 page query
    # s3s-fs walks its whole bucket for every page (minutes for 60 pages): count its files.
    if [ "$AWS_ENDPOINT_URL_S3" = "http://127.0.0.1:${s3_port[s3s-fs]}" ]; then
      find "$s3_root/bench-out/$1" -name manifest.json | wc -l; return
    fi
    while :; do
      query="list-type=2&prefix=$1%2F"
      [ -n "$token" ] && query="continuation-token=$(python3 -c \
        'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1], safe=""))' "$token")&$query"
      page=$(curl -sf --aws-sigv4 aws:amz:us-east-1:s3 -u bench:bench \
        -H "x-amz-content-sha256: $(printf '' | sha256sum | cut -d' ' -f1)" \
        "$AWS_ENDPOINT_URL_S3/bench-out?$query") || { echo "?"; return; }
      n=$((n + $(grep -o '/manifest.json</Key>' <<< "$page" | wc -l)))
      token=$(sed -n 's:.*<NextContinuationToken>\(.*\)</NextContinuationToken>.*:\1:p' <<< "$page")
      [ -z "$token" ] && break
    done
    echo "$n"
  }
  # doubles_run NAME [dispatcher flags...]: a queue and an output prefix of its own, one job per
  # recording, then `dispatcher run` until the queue is empty.
  doubles_run() {
    local name=$1 queue_url; shift
    queue_url=$(curl -sf -X POST http://127.0.0.1:4566/ -H 'X-Amz-Target: AmazonSQS.CreateQueue' \
      -H 'Content-Type: application/x-amz-json-1.0' -d "{\"QueueName\":\"$name\"}" |
      python3 -c 'import json, sys; print(json.load(sys.stdin)["QueueUrl"])') || return 1
    echo "doubles: queue $queue_url, S3 $AWS_ENDPOINT_URL_S3"
    "$BIN/dispatcher" backfill s3://bench-in/corpus/ --queue-url "$queue_url" \
      --output-uri "s3://bench-out/$name/" --model "$MODEL" --s3-force-path-style 2>&1 | tail -2
    RUN_COMMAND="run --queue-url $queue_url --output-uri s3://bench-out/$name/ \
      --s3-force-path-style --exit-when-idle" run "$name" "$CORPUS" "$@"
    echo "$name: $(manifests "$name") manifests"
  }
  IFS=';' read -ra tunes <<< "${DOUBLES_TUNE:-}"
  for s3 in $DOUBLES_S3; do
    export AWS_ENDPOINT_URL_S3=http://127.0.0.1:${s3_port[$s3]}
    doubles_run "run-$s3"
    # Other settings on the same servers (DOUBLES_TUNE="name:args;...", as TUNE): run-S3-NAME.
    for t in "${tunes[@]}"; do
      # shellcheck disable=SC2086 # the run's arguments are words
      doubles_run "run-$s3-${t%%:*}" ${t#*:}
    done
  done
  echo "server CPU (every backfill and run): fakecloud $(ps -o cputime= -p $sqs_pid)$(
    for s3 in $DOUBLES_S3; do printf ', %s %s' "$s3" "$(ps -o cputime= -p "${s3_pid[$s3]}")"; done)"
  kill "$sqs_pid" "${s3_pid[@]}"; wait "$sqs_pid" "${s3_pid[@]}" 2>/dev/null
  unset AWS_ENDPOINT_URL AWS_ENDPOINT_URL_S3
fi

if [ -n "${TARBALL:-}" ]; then
  tar czf "$TARBALL" -C "$(dirname "$OUT")" "$(basename "$OUT")"
fi
