#!/usr/bin/env bash
# One distributed training step (remote Linear(256,256) layers, local head, MSE, distributed
# backward, DistributedOptimizer SGD, batch 32): drpc against PyTorch's
# torch.distributed.autograd (Debian's python3-torch), world sizes 2 and 3, side by side.
#   tools/bench/dist_autograd.sh [--data_plane=grpc|ucx|auto] [STEPS]
#   (--data_plane: the link between drpc's workers, default auto; tools/bench/data_plane.sh)
# Last line: ratios step_w2=X step_w3=X (PyTorch's step time over drpc's; higher is better).
set -euo pipefail
cd "$(dirname "$0")/../.."
source tools/bench/data_plane.sh
set -- "${bench_args[@]+"${bench_args[@]}"}"
tools/install_deps.sh --bench
iters=${1:-100}
bazel build -c opt //tools/bench:rpc_bench >/dev/null 2>&1 || bazel build -c opt //tools/bench:rpc_bench
bin=$(bazel info -c opt bazel-bin 2>/dev/null)/tools/bench/rpc_bench
field() { echo "$1" | grep -o "$2=[0-9.]*" | cut -d= -f2; }
summary="ratios"
for world in 2 3; do
  drpc=$(field "$(GLOG_minloglevel=2 "$bin" --mode=autograd --world_size=$world --iters="$iters" | tail -1)" step_ms)
  torch=$(field "$(/usr/bin/python3 tools/bench/dist_autograd_torch.py $world "$iters" 2>/dev/null | tail -1)" step_ms)
  echo "world=$world step_ms: drpc=$drpc pytorch=$torch"
  summary+=" step_w$world=$(awk -v a="$torch" -v b="$drpc" 'BEGIN { printf "%.2f", a / b }')"
done
echo "$summary"
