#!/usr/bin/env bash
# drpc's process group against PyTorch's Gloo (Debian's python3-torch), side by side, on
# this machine: 64 MiB float32 allreduce bus bandwidth, 4-byte allreduce latency and
# barrier latency, for world sizes 2 and 4. Ratios are drpc over Gloo for bandwidth and
# Gloo over drpc for latency: higher is better for drpc.
#   tools/bench/process_group.sh [--data_plane=grpc|ucx|auto] [LARGE_ITERS [SMALL_ITERS]]
#   (--data_plane: the link between drpc's workers, default auto; tools/bench/data_plane.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
source tools/bench/data_plane.sh
set -- "${bench_args[@]+"${bench_args[@]}"}"
tools/install_deps.sh --bench
large=${1:-5}
small=${2:-1000}
bazel build -c opt //tools/bench:pg_bench >/dev/null 2>&1 || bazel build -c opt //tools/bench:pg_bench
bin=$(bazel info -c opt bazel-bin 2>/dev/null)/tools/bench/pg_bench

field() { echo "$1" | grep -o "$2=[0-9.]*" | cut -d= -f2; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "nan" }'; }

summary="ratios"; lat=""; bar=""
for world in 2 4; do
  drpc=$(GLOG_minloglevel=2 "$bin" --world_size="$world" --large_iters="$large" --small_iters="$small" | tail -1)
  gloo=$(/usr/bin/python3 tools/bench/pg_gloo.py "$world" "$large" "$small" 2>/dev/null | tail -1)
  for metric in busbw_MBps lat_us barrier_us; do
    d=$(field "$drpc" $metric)
    g=$(field "$gloo" $metric)
    if [ $metric = busbw_MBps ]; then r=$(ratio "$d" "$g"); else r=$(ratio "$g" "$d"); fi
    printf 'world=%d %-11s drpc=%-9s gloo=%-9s ratio=%s\n' "$world" "$metric" "$d" "$g" "$r"
    case $metric in
      busbw_MBps) summary+=" busbw_w$world=$r" ;;
      lat_us) lat+=" lat_w$world=$r" ;;
      barrier_us) bar+=" barrier_w$world=$r" ;;
    esac
  done
done
echo "$summary${lat}${bar}"
