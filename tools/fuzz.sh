#!/usr/bin/env bash
# Fuzzes each target in //fuzz with libFuzzer and AddressSanitizer (clang-14), for
# SECONDS_PER_TARGET each (default 60), starting from a copy of its checked-in corpus
# (and crashers). A crash, hang, leak or oversized allocation is copied to
# fuzz/crashers/<target>/, where //fuzz:<target>_fuzzer_test replays it from then on;
# the script exits non-zero if any target failed. Prints per target: executions, coverage.
#   tools/fuzz.sh [SECONDS_PER_TARGET]
#   DRPC_FUZZ_TARGETS="frame rref" tools/fuzz.sh 10     some targets only
#
# The clang build lives in its own Bazel output base (and server, which exits when idle),
# without the disk cache or convenience links, so it never touches the g++ build of a
# shared workspace.
set -uo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
targets=(${DRPC_FUZZ_TARGETS:-frame link_message value_codec rref autograd})
output_base=${DRPC_FUZZ_OUTPUT_BASE:-$HOME/.cache/drpc-fuzz-ob}
command -v clang++-14 >/dev/null || { echo "fuzz.sh: clang-14 is missing (apt-get install clang-14 libclang-rt-14-dev)"; exit 1; }

bazel_fuzz() {
  CC=clang-14 CXX=clang++-14 bazel --output_base="$output_base" --max_idle_secs=600 "$@"
}
flags=(
  --repo_env=CC=clang-14 --repo_env=CXX=clang++-14
  --disk_cache= --symlink_prefix=/
  --copt=-fsanitize=fuzzer-no-link,address --copt=-fno-omit-frame-pointer --copt=-g1
  --linkopt=-fsanitize=address
)
bins=()
for t in "${targets[@]}"; do bins+=("//fuzz:${t}_fuzzer_bin"); done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "=== building ${bins[*]} with clang-14, libFuzzer and ASan"
if ! bazel_fuzz build "${flags[@]}" "${bins[@]}" >"$work/build.log" 2>&1; then
  grep -v 'ld.gold: warning' "$work/build.log" | tail -40
  echo "fuzz.sh: the fuzz build failed"
  exit 1
fi
bin_dir=$(bazel_fuzz info "${flags[@]}" bazel-bin 2>/dev/null)
# libtorch and gRPC are not instrumented: ASan's container-overflow checks misfire on
# std::vectors that cross into them.
export ASAN_OPTIONS=detect_container_overflow=0:symbolize=1
export GLOG_minloglevel=3

failed=0
summary=()
for t in "${targets[@]}"; do
  corpus="$work/$t/corpus" artifacts="$work/$t/artifacts/"
  mkdir -p "$corpus" "$artifacts"
  cp fuzz/corpus/"$t"/* "$corpus"/ 2>/dev/null
  cp fuzz/crashers/"$t"/* "$corpus"/ 2>/dev/null
  extra=() asan=$ASAN_OPTIONS
  # The RRef context leaks at teardown when a peer fetched or called a value that never
  # came (the owner record's pending reply holds the context: a known cycle, reported to
  # the RRef layer's owners). Every World would show it, hiding anything else.
  case "$t" in rref|autograd) extra=(-detect_leaks=0) asan+=:detect_leaks=0 ;; esac
  echo "=== $t: fuzzing for ${seconds}s"
  # -timeout: one input running this long is a hang; -rss_limit_mb also caps any single
  # allocation, so a header that makes a decoder allocate its claim is caught.
  ASAN_OPTIONS=$asan "$bin_dir/fuzz/${t}_fuzzer_bin" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=2048 \
      -artifact_prefix="$artifacts" -print_final_stats=1 "${extra[@]}" "$corpus" >"$work/$t/log" 2>&1
  status=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/$t/log" | grep -o '[0-9]*$' | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$work/$t/log" | tail -1 | grep -o '[0-9]*')
  ft=$(grep -o 'ft: [0-9]*' "$work/$t/log" | tail -1 | grep -o '[0-9]*')
  # libFuzzer also saves slow-unit-* (over 10 s, which a loaded machine can cause): only
  # reported, never a failure; a real hang is a timeout-* (-timeout above).
  slow=$(ls "$artifacts" 2>/dev/null | grep -c '^slow-unit-')
  found=$(ls "$artifacts" 2>/dev/null | grep -cE '^(crash|leak|timeout|oom)-')
  [ "$slow" -gt 0 ] && echo "--- $t: $slow slow input(s) (over 10 s once; not a failure)"
  if [ "$status" -ne 0 ] || [ "$found" -gt 0 ]; then
    failed=1
    mkdir -p fuzz/crashers/"$t"
    for f in "$artifacts"*; do
      case "$(basename "$f")" in crash-*|leak-*|timeout-*|oom-*) cp "$f" fuzz/crashers/"$t"/ ;; esac
    done
    echo "--- $t FAILED (exit $status); the input is now in fuzz/crashers/$t/:"
    ls "$artifacts" | grep -v '^slow-unit-'
    grep -m1 -B2 -A25 -E 'ERROR: (AddressSanitizer|libFuzzer)|fuzz property failed|terminate called|==[0-9]+==' \
      "$work/$t/log" | head -60
  fi
  summary+=("$(printf '%-12s executions %-8s cov %-6s ft %-6s crashes %s' "$t" "${execs:-?}" "${cov:-?}" "${ft:-?}" "$found")")
done

echo "=== fuzz summary (${seconds}s per target)"
printf '%s\n' "${summary[@]}"
exit $failed
