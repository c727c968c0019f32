#!/usr/bin/env bash
# remote(aten::add) followed by to_here(), then DROPS such RRefs dropped at once until
# their owner has freed them all: drpc against PyTorch's RPC (Debian's python3-torch), two
# workers on loopback, us per pair and per dropped RRef, side by side in one run.
#   tools/bench/rref.sh [--data_plane=grpc|ucx|auto] [PAIRS [DROPS]]
#   (--data_plane: the link between drpc's workers, default auto; tools/bench/data_plane.sh)
# Last line: ratios remote_to_here=X drop=X (PyTorch's time over drpc's; higher is better).
set -euo pipefail
cd "$(dirname "$0")/../.."
source tools/bench/data_plane.sh
set -- "${bench_args[@]+"${bench_args[@]}"}"
tools/install_deps.sh --bench
iters=${1:-1000}
drops=${2:-2000}
bazel build -c opt //tools/bench:rpc_bench >/dev/null 2>&1 || bazel build -c opt //tools/bench:rpc_bench
bin=$(bazel info -c opt bazel-bin 2>/dev/null)/tools/bench/rpc_bench
field() { echo "$1" | grep -o "$2=[0-9.]*" | cut -d= -f2; }
drpc_out=$(GLOG_minloglevel=2 "$bin" --mode=rref --iters="$iters" --drops="$drops")
torch_out=$(/usr/bin/python3 tools/bench/rref_torch.py "$iters" "$drops" 2>/dev/null | tail -1)
drpc=$(field "$drpc_out" rref_us)
torch=$(field "$torch_out" rref_us)
drpc_drop=$(field "$drpc_out" rref_drop_us)
torch_drop=$(field "$torch_out" rref_drop_us)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "nan" }'; }
echo "remote+to_here us/pair: drpc=$drpc pytorch=$torch"
echo "drop $drops RRefs, us/RRef until freed: drpc=$drpc_drop pytorch=$torch_drop"
echo "ratios remote_to_here=$(ratio "$torch" "$drpc") drop=$(ratio "$torch_drop" "$drpc_drop")"
