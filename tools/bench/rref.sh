#!/usr/bin/env bash
# remote(aten::add) followed by to_here(): drpc against PyTorch's RPC (Debian's
# python3-torch), two workers on loopback, us per pair, side by side in one run.
#   tools/bench/rref.sh [--data_plane=grpc|ucx|auto] [PAIRS]
#   (--data_plane: the link between drpc's workers, default auto; tools/bench/data_plane.sh)
# Last line: ratios remote_to_here=X (PyTorch's time over drpc's; higher is better).
set -euo pipefail
cd "$(dirname "$0")/../.."
source tools/bench/data_plane.sh
set -- "${bench_args[@]+"${bench_args[@]}"}"
tools/install_deps.sh --bench
iters=${1:-1000}
bazel build -c opt //tools/bench:rpc_bench >/dev/null 2>&1 || bazel build -c opt //tools/bench:rpc_bench
bin=$(bazel info -c opt bazel-bin 2>/dev/null)/tools/bench/rpc_bench
field() { echo "$1" | grep -o "$2=[0-9.]*" | cut -d= -f2; }
drpc=$(field "$(GLOG_minloglevel=2 "$bin" --mode=rref --iters="$iters" | tail -1)" rref_us)
torch=$(field "$(/usr/bin/python3 tools/bench/rref_torch.py "$iters" 2>/dev/null | tail -1)" rref_us)
echo "remote+to_here us/pair: drpc=$drpc pytorch=$torch"
echo "ratios remote_to_here=$(awk -v a="$torch" -v b="$drpc" 'BEGIN { printf "%.2f", a / b }')"
