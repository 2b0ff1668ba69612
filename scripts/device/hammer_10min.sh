#!/usr/bin/env bash
# The 10-minute MPS hammer (issue 5) across two device calls, since one call may last at most
# 10 minutes. From the repository root with `worker`, `fleet` and `hammer` release binaries in
# $BIN (default .device-fleet/, carried):
#
#   call 1:  bash scripts/device/hammer_10min.sh start    # model, single (START_STEPS), then the hammer in the
#                                                         # background; returns after ~9 min
#   call 2:  bash scripts/device/hammer_10min.sh wait     # right after (the machine stays warm
#                                                         # 30 s): waits for the summary
#
# The hammer runs in its own session (setsid), so the end of call 1 does not stop it. Logs under
# $DRILL (default /tmp/drill); call 2 copies hammer.log.gz and the single-clip results to $OUT.
# Seen working on 2026-11-30 (docs/benchmarks.md, "The 10-minute MPS hammer").
set -uo pipefail
export BIN=${BIN:-$PWD/.device-fleet}
DRILL=${DRILL:-/tmp/drill}
HAMMER_S=${HAMMER_S:-600}
mkdir -p "$DRILL"

case "${1:-}" in
start)
  python3 scripts/make_full_size_sortformer.py --out /tmp/sf.nemo 2>&1 | tail -1
  OUT=$DRILL STEPS="${START_STEPS:-model single}" timeout 240 bash scripts/device/gpu_fleet_drill.sh 2>&1 | tail -12
  setsid nohup env BIN="$BIN" OUT="$DRILL" STEPS=hammer HAMMER_S="$HAMMER_S" DIAR_MODEL=/tmp/sf.nemo \
    bash scripts/device/gpu_fleet_drill.sh > "$DRILL/hammer_run.txt" 2>&1 < /dev/null &
  echo "hammer started $(date -u +%T)"
  # Leave the call before its 10-minute limit (CALL_S: seconds after this script's start).
  CALL_S=${CALL_S:-555}
  sleep $((CALL_S - SECONDS > 0 ? CALL_S - SECONDS : 0))
  tail -n 2 "$DRILL/hammer.log" | cut -c1-300
  ;;
wait)
  # A fresh machine (the first call's was released: more than 30 s between the calls) has no
  # hammer to wait for; say so at once instead of spending the call's device time.
  if [ ! -f "$DRILL/hammer.log" ]; then
    echo "no hammer on this machine: call 1's machine was released before this call" >&2
    exit 3
  fi
  # The summary line ends the hammer's log; wait for it (not for process names, which this
  # script's own command line would match).
  until grep -q '"event":"summary"' "$DRILL/hammer.log" 2>/dev/null || [ $SECONDS -ge 300 ]; do
    sleep 3
  done
  grep -E '"summary"' "$DRILL/hammer.log" | cut -c1-1200
  if [ -n "${OUT:-}" ]; then
    cp "$DRILL/hammer.log" "$DRILL/single.txt" "$DRILL/latency45.json" "$OUT/" 2>/dev/null
    gzip -f "$OUT/hammer.log" 2>/dev/null
  fi
  ;;
*)
  echo "usage: $0 start|wait" >&2
  exit 2
  ;;
esac
