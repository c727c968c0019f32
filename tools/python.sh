#!/usr/bin/env bash
# Builds drpc's Python package and prints the PYTHONPATH that makes `import drpc` work
# with /usr/bin/python3 (Debian's python3-torch is the torch drpc links against):
#   export PYTHONPATH=$(tools/python.sh)
#   /usr/bin/python3 -c 'import drpc'
# Arguments are passed to `bazel build` (e.g. -c opt); DRPC_BAZEL replaces the bazel
# command itself, for startup options: DRPC_BAZEL="bazel --output_base=DIR".
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh --python >&2
bazel=${DRPC_BAZEL:-bazel}
$bazel build "$@" //python:drpc >&2
echo "$($bazel info "$@" bazel-bin 2>/dev/null)/python"
