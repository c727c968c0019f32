#!/usr/bin/env bash
# The main job: trains an MLP on Fashion-MNIST (Debian's dataset-fashion-mnist) with the
# model split across workers on this machine: rank 0 holds the input layer and the head,
# every other rank a hidden block behind RRefs; forward over RPC, distributed backward,
# DistributedOptimizer. Installs what is missing, builds, and launches the workers.
#   tools/demo.sh [--python] [--workers=3] [--epochs=2] [--batch_size=64] [--lr=0.05] [--limit=N]
# --python: the same job written in Python with `import drpc` (tools/demo.py), run by
# /usr/bin/python3 with the package tools/python.sh builds.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh --demo
workers=3
python=0
args=()
for arg in "$@"; do
  case "$arg" in
    --workers=*) workers="${arg#--workers=}" ;;
    --python) python=1 ;;
    *) args+=("$arg") ;;
  esac
done
if [ "$python" = 1 ]; then
  pythonpath=$(tools/python.sh -c opt 2>/dev/null) || pythonpath=$(tools/python.sh -c opt)
  PYTHONPATH="$pythonpath" GLOG_minloglevel=${GLOG_minloglevel:-2} exec /usr/bin/python3 tools/demo.py \
    --workers="$workers" "${args[@]+"${args[@]}"}"
fi
bazel build -c opt //tools/demo:fashion_mnist //tools/launch:drpc_launch >/dev/null 2>&1 ||
  bazel build -c opt //tools/demo:fashion_mnist //tools/launch:drpc_launch
bin=$(bazel info -c opt bazel-bin 2>/dev/null)
GLOG_minloglevel=${GLOG_minloglevel:-2} exec "$bin/tools/launch/drpc_launch" --nproc="$workers" -- \
  "$bin/tools/demo/fashion_mnist" "${args[@]}"
