#!/usr/bin/env bash
# remote(aten::add) followed by to_here(), then DROPS such RRefs dropped at once until
# their owner has freed them all: drpc against PyTorch's RPC (Debian's python3-torch), two
# workers on loopback, us per pair and per dropped RRef, side by side in one run.
#   tools/bench/rref.sh [--data_plane=grpc|ucx|auto] [--rounds=N] [PAIRS [DROPS]]
#   (options: tools/bench/common.sh; rounds alternate drpc and PyTorch, default 3)
# Last line: ratios remote_to_here=X drop=X (PyTorch's time over drpc's, the median of the
# rounds; higher is better).
set -euo pipefail
cd "$(dirname "$0")/../.."
source tools/bench/common.sh
set -- "${bench_args[@]+"${bench_args[@]}"}"
tools/install_deps.sh --bench
iters=${1:-1000}
drops=${2:-2000}
bazel build -c opt //tools/bench:rpc_bench >/dev/null 2>&1 || bazel build -c opt //tools/bench:rpc_bench
bin=$(bazel info -c opt bazel-bin 2>/dev/null)/tools/bench/rpc_bench
pair_ratios=(); drop_ratios=()
for round in $(seq 1 "$bench_rounds"); do
  drpc_out=$(GLOG_minloglevel=2 "$bin" --mode=rref --iters="$iters" --drops="$drops")
  torch_out=$(/usr/bin/python3 tools/bench/rref_torch.py "$iters" "$drops" 2>/dev/null | tail -1)
  drpc=$(field "$drpc_out" rref_us)
  torch=$(field "$torch_out" rref_us)
  drpc_drop=$(field "$drpc_out" rref_drop_us)
  torch_drop=$(field "$torch_out" rref_drop_us)
  pair_ratios+=("$(ratio "$torch" "$drpc")"); drop_ratios+=("$(ratio "$torch_drop" "$drpc_drop")")
  echo "round=$round remote+to_here us/pair: drpc=$drpc pytorch=$torch ratio=${pair_ratios[-1]};" \
       "drop $drops RRefs, us/RRef until freed: drpc=$drpc_drop pytorch=$torch_drop ratio=${drop_ratios[-1]}"
done
echo "ratio ranges: remote_to_here $(spread "${pair_ratios[@]}") drop $(spread "${drop_ratios[@]}")"
echo "ratios remote_to_here=$(median "${pair_ratios[@]}") drop=$(median "${drop_ratios[@]}")"
