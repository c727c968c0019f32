#!/usr/bin/env bash
# drpc against PyTorch's torch.distributed.rpc (TensorPipe, Debian's python3-torch) and a
# raw TCP ping-pong, side by side, two workers on loopback.
#   tools/bench/rpc.sh [--python] [--data_plane=grpc|ucx|auto] [SYNC_CALLS [ASYNC_CALLS [ECHO_ITERS]]]
#   (--data_plane: the link between drpc's workers, default auto; tools/bench/data_plane.sh)
# Last line: ratios sync_latency=X async_throughput=X echo_64mb=X sync_vs_tcp=X
# (each drpc against PyTorch, higher is better for drpc; sync_vs_tcp = drpc's latency
# over raw TCP's, lower is better).
# --python: drpc measured from Python as well (tools/bench/rpc_drpc.py: the same calls as
# rpc_torch.py through `import drpc`, the module built -c opt), beside the C++ rpc_bench;
# then the last line is drpc-from-Python against PyTorch, Python against Python:
# ratios sync_latency=X async_throughput=X echo_64mb=X, after a python_vs_cpp line
# (drpc from Python over drpc from C++, the same way round: 1 = the binding costs nothing).
# DRPC_BAZEL replaces the bazel command, for startup options (as in tools/python.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
source tools/bench/data_plane.sh
set -- "${bench_args[@]+"${bench_args[@]}"}"
python=0
if [ "${1:-}" = "--python" ]; then
  python=1
  shift
fi
tools/install_deps.sh --bench
sync=${1:-2000}
async=${2:-10000}
echo_iters=${3:-5}
bazel=${DRPC_BAZEL:-bazel}
$bazel build -c opt //tools/bench:rpc_bench >/dev/null 2>&1 || $bazel build -c opt //tools/bench:rpc_bench
bin=$($bazel info -c opt bazel-bin 2>/dev/null)/tools/bench/rpc_bench

field() { echo "$1" | grep -oE "(^| )$2=[0-9.]*" | cut -d= -f2; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "nan" }'; }

drpc=$(GLOG_minloglevel=2 "$bin" --sync_calls="$sync" --async_calls="$async" --echo_iters="$echo_iters" | tail -1)
torch=$(/usr/bin/python3 tools/bench/rpc_torch.py "$sync" "$async" "$echo_iters" 2>/dev/null | tail -1)
if [ "$python" = 1 ]; then
  pythonpath=$(DRPC_BAZEL="$bazel" tools/python.sh -c opt 2>/dev/null) || pythonpath=$(DRPC_BAZEL="$bazel" tools/python.sh -c opt)
  py=$(PYTHONPATH="$pythonpath" GLOG_minloglevel=2 /usr/bin/python3 tools/bench/rpc_drpc.py "$sync" "$async" "$echo_iters" \
       2>/dev/null | tail -1)
  printf '%-10s drpc_py=%-9s drpc_cpp=%-9s pytorch=%-9s\n' sync_us "$(field "$py" sync_us)" "$(field "$drpc" sync_us)" "$(field "$torch" sync_us)"
  printf '%-10s drpc_py=%-9s drpc_cpp=%-9s pytorch=%-9s\n' async_cps "$(field "$py" async_cps)" "$(field "$drpc" async_cps)" "$(field "$torch" async_cps)"
  printf '%-10s drpc_py=%-9s drpc_cpp=%-9s pytorch=%-9s\n' echo_MBps "$(field "$py" echo_MBps)" "$(field "$drpc" echo_MBps)" "$(field "$torch" echo_MBps)"
  printf '%-10s tcp=%s\n' tcp_us "$(field "$drpc" tcp_us)"
  echo "python_vs_cpp sync_latency=$(ratio "$(field "$drpc" sync_us)" "$(field "$py" sync_us)")" \
       "async_throughput=$(ratio "$(field "$py" async_cps)" "$(field "$drpc" async_cps)")" \
       "echo_64mb=$(ratio "$(field "$py" echo_MBps)" "$(field "$drpc" echo_MBps)")"
  echo "ratios sync_latency=$(ratio "$(field "$torch" sync_us)" "$(field "$py" sync_us)")" \
       "async_throughput=$(ratio "$(field "$py" async_cps)" "$(field "$torch" async_cps)")" \
       "echo_64mb=$(ratio "$(field "$py" echo_MBps)" "$(field "$torch" echo_MBps)")"
  exit 0
fi
printf '%-10s drpc=%-9s pytorch=%-9s\n' sync_us "$(field "$drpc" sync_us)" "$(field "$torch" sync_us)"
printf '%-10s drpc=%-9s pytorch=%-9s\n' async_cps "$(field "$drpc" async_cps)" "$(field "$torch" async_cps)"
printf '%-10s drpc=%-9s pytorch=%-9s\n' echo_MBps "$(field "$drpc" echo_MBps)" "$(field "$torch" echo_MBps)"
printf '%-10s tcp=%s\n' tcp_us "$(field "$drpc" tcp_us)"
printf '%-10s sync=%s async=%s (drpc, both workers, user + system)\n' cpu_s_per_10k \
  "$(field "$drpc" sync_cpu_s_per_10k)" "$(field "$drpc" async_cpu_s_per_10k)"
echo "ratios sync_latency=$(ratio "$(field "$torch" sync_us)" "$(field "$drpc" sync_us)")" \
     "async_throughput=$(ratio "$(field "$drpc" async_cps)" "$(field "$torch" async_cps)")" \
     "echo_64mb=$(ratio "$(field "$drpc" echo_MBps)" "$(field "$torch" echo_MBps)")" \
     "sync_vs_tcp=$(ratio "$(field "$drpc" sync_us)" "$(field "$drpc" tcp_us)")"
