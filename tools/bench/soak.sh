#!/usr/bin/env bash
# Soak: a mixed load (rpc_sync, rpc_async, remote, to_here, RRefs handed to third workers,
# distributed backward + DistributedOptimizer) from every worker to every other, 4 worker
# processes on loopback for MINUTES (fractions allowed), then a graceful shutdown.
#   tools/bench/soak.sh MINUTES [--threads=N --async_batch=N --worker_threads=N ...]
# (extra flags go to every soak_worker; the defaults are drpc's own, 4 handler threads).
# Prints each worker's line (calls, errors, resident memory after the warm-up -- the first
# 10% of the time or 60 s, whichever is smaller -- and at the end, RRefs and autograd
# contexts left after shutdown) and a total. Exits non-zero if any call failed, any
# worker's memory grew 10% or more, anything was left after shutdown, or a worker failed.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ $# -lt 1 ]] || ! awk -v m="$1" 'BEGIN { exit !(m + 0 > 0) }'; then
  echo "usage: tools/bench/soak.sh MINUTES [soak_worker flags]" >&2
  exit 2
fi
minutes=$1
shift
workers=4
seconds=$(awk -v m="$minutes" 'BEGIN { printf "%.0f", m * 60 }')
progress=$(awk -v s="$seconds" 'BEGIN { p = s / 10; if (p < 10) p = 10; if (p > 60) p = 60; printf "%.0f", p }')

bazel build -c opt //tools/bench:soak_worker >/dev/null 2>&1 || bazel build -c opt //tools/bench:soak_worker
bin=$(bazel info -c opt bazel-bin 2>/dev/null)/tools/bench/soak_worker

dir=$(mktemp -d -t drpc-soak.XXXXXX)
pids=()
# Every exit path: stop what still runs (TERM, then KILL after 5 s), keep logs of a failure.
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  local alive=()
  for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive+=("$pid"); done
  if [[ ${#alive[@]} -gt 0 ]]; then
    kill -TERM "${alive[@]}" 2>/dev/null || true
    for _ in $(seq 50); do
      local any=0
      for pid in "${alive[@]}"; do kill -0 "$pid" 2>/dev/null && any=1; done
      [[ $any == 0 ]] && break
      sleep 0.1
    done
    kill -KILL "${alive[@]}" 2>/dev/null || true
  fi
  wait 2>/dev/null || true
  if [[ $rc == 0 ]]; then rm -rf "$dir"; else echo "logs kept in $dir" >&2; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "soak: $workers workers, $minutes min ($seconds s), logs in $dir"
for ((r = 0; r < workers; r++)); do
  GLOG_logtostderr=1 "$bin" --rank=$r --world_size=$workers --port_file="$dir/port" --seconds="$seconds" \
    --progress_seconds="$progress" "$@" >"$dir/out.$r" 2>"$dir/err.$r" &
  pids+=($!)
done

# Wait for all; the first failure stops the rest. A job still running long after its
# time (shutdown hanging) is a failure too.
deadline=$((SECONDS + seconds + 300))
status=()
finished=0
failed=""
last_progress=0
while [[ $finished -lt $workers ]]; do
  for ((r = 0; r < workers; r++)); do
    [[ -n ${status[$r]:-} ]] && continue
    if ! kill -0 "${pids[$r]}" 2>/dev/null; then
      rc=0
      wait "${pids[$r]}" || rc=$?
      status[$r]=$rc
      finished=$((finished + 1))
      # soak_worker exits 1 for errors or leftovers (reported below); anything else is a crash.
      if [[ $rc != 0 && $rc != 1 && -z $failed ]]; then
        failed="worker$r exited with status $rc"
        for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
      fi
    fi
  done
  if [[ $SECONDS -gt $deadline && -z $failed ]]; then
    failed="the job did not finish within $((seconds + 300)) s"
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  fi
  # Worker 0's progress as it comes.
  n=$(grep -c '^progress' "$dir/out.0" 2>/dev/null || true)
  if [[ ${n:-0} -gt $last_progress ]]; then
    grep '^progress' "$dir/out.0" | sed -n "$((last_progress + 1)),${n}p"
    last_progress=$n
  fi
  sleep 1
done

echo "--- per worker"
ok=1
for ((r = 0; r < workers; r++)); do
  grep "^worker$r " "$dir/out.$r" || true
  if ! grep -q "^worker$r calls=" "$dir/out.$r"; then
    ok=0
    echo "worker$r: no result (status ${status[$r]}); the end of its log:"
    tail -n 8 "$dir/err.$r" | sed 's/^/  /'
  fi
done
leaks=$(cat "$dir"/err.* | grep -c 'leaked' || true)
if [[ $leaks -gt 0 ]]; then
  echo "leak reports at shutdown: $leaks"
  grep -h 'leaked' "$dir"/err.* | head -n 10 | sed 's/^/  /'
fi
errors_logged=$(cat "$dir"/err.* | grep -c '^E' || true)
if [[ $errors_logged -gt 0 ]]; then
  echo "first errors logged:"
  grep -h '^E' "$dir"/err.* | head -n 10 | sed 's/^/  /'
fi

cat "$dir"/out.* | grep -E '^worker[0-9]+ calls=' | awk -v ok="$ok" -v failed="$failed" -v leaks="$leaks" '
  function field(name,   i, kv) {
    for (i = 2; i <= NF; i++) { split($i, kv, "="); if (kv[1] == name) return kv[2] }
    return ""
  }
  {
    n++; calls += field("calls"); errors += field("errors")
    g = field("growth"); sub(/%/, "", g); if (g + 0 > max_growth || n == 1) max_growth = g + 0
    if (g + 0 >= 10 || field("rss_start_MB") + 0 <= 0) grew++
    left += field("rrefs_left") + field("contexts_left")
  }
  END {
    verdict = (ok && failed == "" && n == 4 && errors == 0 && grew == 0 && left == 0 && leaks == 0) ? "PASS" : "FAIL"
    printf "total calls=%d errors=%d max_growth=%.1f%% workers_over_10%%=%d left_after_shutdown=%d leak_reports=%d workers_reporting=%d %s%s\n",
           calls, errors, max_growth, grew, left, leaks, n, verdict, failed == "" ? "" : " (" failed ")"
    exit verdict == "PASS" ? 0 : 1
  }' || exit 1
