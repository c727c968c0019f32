#!/usr/bin/env bash
# drpc against PyTorch's torch.distributed.rpc (TensorPipe, Debian's python3-torch) and a
# raw TCP ping-pong, side by side, two workers on loopback.
#   tools/bench/rpc.sh [--python] [--data_plane=grpc|ucx|auto] [--rounds=N] [SYNC_CALLS [ASYNC_CALLS [ECHO_ITERS]]]
#   (options: tools/bench/common.sh; rounds alternate drpc and PyTorch, default 3)
# Last line: ratios sync_latency=X async_throughput=X echo_64mb=X sync_vs_tcp=X
# (each drpc against PyTorch, higher is better for drpc; sync_vs_tcp = drpc's latency
# over raw TCP's, lower is better; each the median of the rounds' ratios).
# --python: drpc measured from Python as well (tools/bench/rpc_drpc.py: the same calls as
# rpc_torch.py through `import drpc`, the module built -c opt), beside the C++ rpc_bench;
# then the last line is drpc-from-Python against PyTorch, Python against Python:
# ratios sync_latency=X async_throughput=X echo_64mb=X, after a python_vs_cpp line
# (drpc from Python over drpc from C++, the same way round: 1 = the binding costs nothing).
# DRPC_BAZEL replaces the bazel command, for startup options (as in tools/python.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
source tools/bench/common.sh
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

if [ "$python" = 1 ]; then
  pythonpath=$(DRPC_BAZEL="$bazel" tools/python.sh -c opt 2>/dev/null) || pythonpath=$(DRPC_BAZEL="$bazel" tools/python.sh -c opt)
fi

# Per round: each figure (name=value words) and each ratio, collected for the medians.
declare -A figures=() ratios=()
keep() { figures[$1]+=" $2"; }
keep_ratio() { ratios[$1]+=" $2"; }
for round in $(seq 1 "$bench_rounds"); do
  drpc=$(GLOG_minloglevel=2 "$bin" --sync_calls="$sync" --async_calls="$async" --echo_iters="$echo_iters" | tail -1)
  torch=$(/usr/bin/python3 tools/bench/rpc_torch.py "$sync" "$async" "$echo_iters" 2>/dev/null | tail -1)
  for f in sync_us async_cps echo_MBps; do keep "drpc_$f" "$(field "$drpc" $f)"; keep "torch_$f" "$(field "$torch" $f)"; done
  for f in tcp_us sync_cpu_s_per_10k async_cpu_s_per_10k; do keep "drpc_$f" "$(field "$drpc" $f)"; done
  keep_ratio sync_vs_tcp "$(ratio "$(field "$drpc" sync_us)" "$(field "$drpc" tcp_us)")"
  mine=$drpc
  if [ "$python" = 1 ]; then
    py=$(PYTHONPATH="$pythonpath" GLOG_minloglevel=2 /usr/bin/python3 tools/bench/rpc_drpc.py "$sync" "$async" "$echo_iters" \
         2>/dev/null | tail -1)
    for f in sync_us async_cps echo_MBps; do keep "py_$f" "$(field "$py" $f)"; done
    keep_ratio py_sync "$(ratio "$(field "$drpc" sync_us)" "$(field "$py" sync_us)")"
    keep_ratio py_async "$(ratio "$(field "$py" async_cps)" "$(field "$drpc" async_cps)")"
    keep_ratio py_echo "$(ratio "$(field "$py" echo_MBps)" "$(field "$drpc" echo_MBps)")"
    mine=$py
  fi
  keep_ratio sync_latency "$(ratio "$(field "$torch" sync_us)" "$(field "$mine" sync_us)")"
  keep_ratio async_throughput "$(ratio "$(field "$mine" async_cps)" "$(field "$torch" async_cps)")"
  keep_ratio echo_64mb "$(ratio "$(field "$mine" echo_MBps)" "$(field "$torch" echo_MBps)")"
  echo "round=$round drpc: $drpc"
  [ "$python" = 1 ] && echo "round=$round drpc_py: $py"
  echo "round=$round pytorch: $torch"
done
# shellcheck disable=SC2086  # the lists are words
med() { median ${figures[$1]}; }
# shellcheck disable=SC2086
medr() { median ${ratios[$1]}; }
# shellcheck disable=SC2086
spreadr() { spread ${ratios[$1]}; }

echo "medians of $bench_rounds rounds:"
if [ "$python" = 1 ]; then
  for f in sync_us async_cps echo_MBps; do
    printf '%-10s drpc_py=%-9s drpc_cpp=%-9s pytorch=%-9s\n' $f "$(med py_$f)" "$(med drpc_$f)" "$(med torch_$f)"
  done
  printf '%-10s tcp=%s\n' tcp_us "$(med drpc_tcp_us)"
  echo "python_vs_cpp sync_latency=$(medr py_sync) async_throughput=$(medr py_async) echo_64mb=$(medr py_echo)"
  echo "ratio ranges: sync_latency $(spreadr sync_latency) async_throughput $(spreadr async_throughput)" \
       "echo_64mb $(spreadr echo_64mb)"
  echo "ratios sync_latency=$(medr sync_latency) async_throughput=$(medr async_throughput) echo_64mb=$(medr echo_64mb)"
  exit 0
fi
for f in sync_us async_cps echo_MBps; do
  printf '%-10s drpc=%-9s pytorch=%-9s\n' $f "$(med drpc_$f)" "$(med torch_$f)"
done
printf '%-10s tcp=%s\n' tcp_us "$(med drpc_tcp_us)"
printf '%-10s sync=%s async=%s (drpc, both workers, user + system)\n' cpu_s_per_10k \
  "$(med drpc_sync_cpu_s_per_10k)" "$(med drpc_async_cpu_s_per_10k)"
echo "ratio ranges: sync_latency $(spreadr sync_latency) async_throughput $(spreadr async_throughput)" \
     "echo_64mb $(spreadr echo_64mb) sync_vs_tcp $(spreadr sync_vs_tcp)"
echo "ratios sync_latency=$(medr sync_latency) async_throughput=$(medr async_throughput)" \
     "echo_64mb=$(medr echo_64mb) sync_vs_tcp=$(medr sync_vs_tcp)"
