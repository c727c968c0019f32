#!/usr/bin/env bash
# One distributed training step (remote Linear(256,256) layers, local head, MSE, distributed
# backward, DistributedOptimizer SGD, batch 32): drpc against PyTorch's
# torch.distributed.autograd (Debian's python3-torch), world sizes 2 and 3, side by side.
#   tools/bench/dist_autograd.sh [--data_plane=grpc|ucx|auto] [--rounds=N] [STEPS]
#   (options: tools/bench/common.sh; rounds alternate drpc and PyTorch, default 3)
# Last line: ratios step_w2=X step_w3=X (PyTorch's step time over drpc's, the median of the
# rounds; higher is better).
set -euo pipefail
cd "$(dirname "$0")/../.."
source tools/bench/common.sh
set -- "${bench_args[@]+"${bench_args[@]}"}"
tools/install_deps.sh --bench
iters=${1:-100}
bazel build -c opt //tools/bench:rpc_bench >/dev/null 2>&1 || bazel build -c opt //tools/bench:rpc_bench
bin=$(bazel info -c opt bazel-bin 2>/dev/null)/tools/bench/rpc_bench
summary="ratios"
for world in 2 3; do
  drpc_ms=(); torch_ms=(); ratios=()
  for round in $(seq 1 "$bench_rounds"); do
    drpc=$(field "$(GLOG_minloglevel=2 "$bin" --mode=autograd --world_size=$world --iters="$iters" | tail -1)" step_ms)
    torch=$(field "$(/usr/bin/python3 tools/bench/dist_autograd_torch.py $world "$iters" 2>/dev/null | tail -1)" step_ms)
    drpc_ms+=("$drpc"); torch_ms+=("$torch"); ratios+=("$(ratio "$torch" "$drpc")")
    echo "world=$world round=$round step_ms: drpc=$drpc pytorch=$torch ratio=${ratios[-1]}"
  done
  echo "world=$world step_ms (median, range): drpc=$(median "${drpc_ms[@]}") ($(spread "${drpc_ms[@]}"))" \
       "pytorch=$(median "${torch_ms[@]}") ($(spread "${torch_ms[@]}")) ratio=$(median "${ratios[@]}") ($(spread "${ratios[@]}"))"
  summary+=" step_w$world=$(median "${ratios[@]}")"
done
echo "$summary"
