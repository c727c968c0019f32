#!/usr/bin/env bash
# drpc's process group against PyTorch's Gloo (Debian's python3-torch), side by side, on
# this machine: 64 MiB float32 allreduce bus bandwidth, 4-byte allreduce latency and
# barrier latency, for world sizes 2 and 4. Ratios are drpc over Gloo for bandwidth and
# Gloo over drpc for latency: higher is better for drpc.
#   tools/bench/process_group.sh [--data_plane=grpc|ucx|auto] [--rounds=N] [LARGE_ITERS [SMALL_ITERS]]
#   (options: tools/bench/common.sh; rounds alternate drpc and Gloo, default 3, and the
#   ratios printed are the medians of the rounds')
set -euo pipefail
cd "$(dirname "$0")/../.."
source tools/bench/common.sh
set -- "${bench_args[@]+"${bench_args[@]}"}"
tools/install_deps.sh --bench
large=${1:-5}
small=${2:-1000}
bazel build -c opt //tools/bench:pg_bench >/dev/null 2>&1 || bazel build -c opt //tools/bench:pg_bench
bin=$(bazel info -c opt bazel-bin 2>/dev/null)/tools/bench/pg_bench

summary="ratios"; lat=""; bar=""
for world in 2 4; do
  declare -A drpc_v=() gloo_v=() ratio_v=()
  for round in $(seq 1 "$bench_rounds"); do
    drpc=$(GLOG_minloglevel=2 "$bin" --world_size="$world" --large_iters="$large" --small_iters="$small" | tail -1)
    gloo=$(/usr/bin/python3 tools/bench/pg_gloo.py "$world" "$large" "$small" 2>/dev/null | tail -1)
    line="world=$world round=$round"
    for metric in busbw_MBps lat_us barrier_us; do
      d=$(field "$drpc" $metric)
      g=$(field "$gloo" $metric)
      if [ $metric = busbw_MBps ]; then r=$(ratio "$d" "$g"); else r=$(ratio "$g" "$d"); fi
      drpc_v[$metric]+=" $d"; gloo_v[$metric]+=" $g"; ratio_v[$metric]+=" $r"
      line+=" $metric: drpc=$d gloo=$g ratio=$r;"
    done
    echo "$line"
  done
  for metric in busbw_MBps lat_us barrier_us; do
    # shellcheck disable=SC2086  # the lists are words
    r=$(median ${ratio_v[$metric]})
    # shellcheck disable=SC2086
    printf 'world=%d %-11s median drpc=%-9s gloo=%-9s ratio=%s (rounds %s)\n' "$world" "$metric" \
      "$(median ${drpc_v[$metric]})" "$(median ${gloo_v[$metric]})" "$r" "$(spread ${ratio_v[$metric]})"
    case $metric in
      busbw_MBps) summary+=" busbw_w$world=$r" ;;
      lat_us) lat+=" lat_w$world=$r" ;;
      barrier_us) bar+=" barrier_w$world=$r" ;;
    esac
  done
  unset drpc_v gloo_v ratio_v
done
echo "$summary${lat}${bar}"
