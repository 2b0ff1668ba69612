#!/usr/bin/env bash
# Two builds of the dispatcher and worker side by side on the GPU machine: host CPU per format
# (pipeline_bench.sh's `formats` step), alternating A and B, ROUNDS times each, on one corpus.
# A is .device-pipeline/bins.tar.xz (the current build); B is the same bundle with its
# dispatcher and worker replaced by those packed in B_TARBALL (default
# .device-pipeline-old/generic.tar.xz: f0ddc55 built for generic x86-64, session 30). Ends with
# one line per (format, build, round): audio-s per core-second and the dispatcher's CPU.
# Usage (repository root, one device call, about 6 minutes with the defaults):
#   bash scripts/bench/build_ab.sh
# Settings: FORMATS (default "mp3 m4a wav"), ROUNDS (2), HOURS (24: the corpus made first).
set -uo pipefail
FORMATS=${FORMATS:-mp3 m4a wav}
ROUNDS=${ROUNDS:-2}
HOURS=${HOURS:-24}
B_TARBALL=${B_TARBALL:-.device-pipeline-old/generic.tar.xz}
bench="bash scripts/bench/pipeline_bench.sh"
rm -rf /tmp/ab-a-bin /tmp/ab-b-bin
mkdir -p /tmp/ab-a-bin /tmp/ab-b-bin
for dir in /tmp/ab-a-bin /tmp/ab-b-bin; do
  xz -dc .device-pipeline/bins.tar.xz | tar -C "$dir" -xf - || exit 1
done
xz -dc "$B_TARBALL" | tar -C /tmp/ab-b-bin -xf - || exit 1
BIN=/tmp/ab-a-bin HOURS=$HOURS STEPS="model corpus" OUT=/tmp/ab-setup $bench > /tmp/ab-setup.log 2>&1
for round in $(seq "$ROUNDS"); do
  for build in a b; do
    BIN=/tmp/ab-$build-bin STEPS=formats FORMATS="$FORMATS" OUT=/tmp/ab-$build-$round $bench \
      > "/tmp/ab-$build-$round.log" 2>&1
  done
done
python3 - "$ROUNDS" <<'PY'
import json, sys
rounds = int(sys.argv[1])
for build in "ab":
    for r in range(1, rounds + 1):
        rows = {}
        try:
            rows = {x["run"]: x for x in map(json.loads, open(f"/tmp/ab-{build}-{r}/results.jsonl"))}
        except OSError as e:
            print(f"build {build} round {r}: no results ({e})")
            continue
        def beyond_load(x):
            return x["host_cpu_s"] - x.get("threads_cpu_s", {}).get("worker/worker", 0.0)
        base = beyond_load(rows["formats-none"]) if "formats-none" in rows else 0.0
        for name, x in rows.items():
            if not name.startswith("formats-") or not x.get("audio_s"):
                continue
            cpu = beyond_load(x) - base
            print(f"{name[8:]:9} build {build} round {r}: {x['audio_s'] / cpu:6.0f} audio-s per "
                  f"core-second; dispatcher {x['dispatcher_cpu_s']:6.1f} s (system "
                  f"{x.get('dispatcher_sys_s', 0):.1f}); {x['audio_s_per_s']} audio-s/s")
PY
