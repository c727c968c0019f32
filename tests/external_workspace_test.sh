#!/usr/bin/env bash
# drpc used from another Bazel workspace, as README's "Using drpc from your workspace"
# says: a consumer workspace (local_repository + drpc_deps(), nothing else of drpc's) builds
# a program over @drpc//:drpc and one over the process group alone
# (@drpc//process_group:grpc and :grpc_store), and runs a 2-worker job of each.
#
# The nested Bazel is offline, has its own output root under TEST_TMPDIR (HOME too), runs
# in --batch mode (no server left behind) and shares drpc's disk cache
# (~/.cache/drpc-bazel-disk), with --incompatible_strict_action_env so that action keys do
# not depend on the caller's PATH: after one run, compiled objects are reused. The first run
# on a machine compiles drpc once more (its sources sit under external/drpc there).
# Runs outside `bazel test` too: tests/external_workspace_test.sh
set -euo pipefail

self=$(readlink -f "${BASH_SOURCE[0]}")
drpc=$(cd "$(dirname "$self")/.." && pwd)
tmp=${TEST_TMPDIR:-$(mktemp -d)}
real_home=$(getent passwd "$(id -u)" | cut -d: -f6)
disk_cache=${DRPC_DISK_CACHE:-$real_home/.cache/drpc-bazel-disk}
ws=$tmp/consumer
rm -rf "$ws"
mkdir -p "$ws" "$tmp/home"
cp "$drpc/tests/external_workspace/job.cc" "$drpc/tests/external_workspace/pg_only.cc" "$ws/"
cp "$drpc/tests/external_workspace/BUILD.consumer" "$ws/BUILD"
cat > "$ws/WORKSPACE" <<EOW
workspace(name = "consumer")

local_repository(name = "drpc", path = "$drpc")

load("@drpc//:deps.bzl", "drpc_deps")

drpc_deps()
EOW
cat > "$ws/.bazelrc" <<EOR
build --cxxopt=-std=c++17 --host_cxxopt=-std=c++17
build --experimental_repository_disable_download
build --disk_cache=$disk_cache
build --incompatible_strict_action_env
build --spawn_strategy=local
EOR

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

cd "$ws"
start=$(date +%s)
HOME="$tmp/home" bazel --output_user_root="$tmp/bazel_root" --batch build --jobs=2 //:job //:pg_only 2>&1 |
  grep -v '^Loading\|^Analyzing\|^INFO: From\|^\[' || true
[ -x bazel-bin/job ] && [ -x bazel-bin/pg_only ] || { echo "the consumer workspace did not build"; exit 1; }
echo "built in $(( $(date +%s) - start )) s"

free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Runs BINARY as ranks 0 and 1 of a 2-process job; both must exit 0 within 60 s.
run_job() {
  local binary=$1 port
  port=$(free_port)
  pids=()
  for rank in 0 1; do
    GLOG_minloglevel=2 timeout -s KILL 60 "$binary" "$rank" "$port" > "$tmp/$(basename "$binary").$rank.log" 2>&1 &
    pids+=($!)
  done
  local failed=0
  for i in 0 1; do wait "${pids[$i]}" || { echo "$binary rank $i failed: status $?"; failed=1; }; done
  pids=()
  cat "$tmp/$(basename "$binary")".*.log
  return $failed
}
run_job bazel-bin/job
grep -q '^consumer job: ok' "$tmp/job.0.log" || { echo "the consumer job's result is wrong"; exit 1; }
run_job bazel-bin/pg_only
grep -q 'process group rank 1: ok' "$tmp/pg_only.1.log" || { echo "the process group job's result is wrong"; exit 1; }
echo "1 passed, 0 failed"
