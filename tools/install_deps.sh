#!/usr/bin/env bash
# Installs what drpc needs from Debian's packages (apt only, nothing else is downloaded).
# Idempotent and quiet when everything is already there.
#   tools/install_deps.sh            build and test dependencies
#   tools/install_deps.sh --bench    also PyTorch's Python package, the benchmarks' peer
#   tools/install_deps.sh --demo     what the main job needs (the same set today)
#   tools/install_deps.sh --python   what `import drpc` needs (the same set: //python is tested with the rest)
set -euo pipefail

packages=(
  bazel-bootstrap             # Bazel 4.2.3
  g++
  libtorch-dev                # libtorch 1.13 (CPU)
  libopenblas0-serial         # libtorch's BLAS: Debian's default is the reference one, 10-20x slower at
                              # matmul; serial, because workers already share the cores (PyTorch's side of
                              # the benchmarks loads the same libblas.so.3)
  libgrpc++-dev protobuf-compiler-grpc
  libprotobuf-dev protobuf-compiler
  libgoogle-glog-dev libgflags-dev
  libucx-dev                  # UCX: the data plane between workers on one host (and across, if asked)
  libgtest-dev libgmock-dev
  libbenchmark-dev
  zlib1g-dev
  iproute2                    # the network-namespace test
  openssl                     # TLS tests make their certificates
  dataset-fashion-mnist       # the main job's data (and its test's)
  python3-dev pybind11-dev python3-torch   # //python: the extension module and its tests
  python3-kubernetes python3-yaml          # deploy/'s manifests are checked against Kubernetes' API models
  podman mmdebstrap uidmap runc            # tools/image.sh and the container job's test
)
for arg in "$@"; do
  case "$arg" in
    --bench) packages+=(python3-torch) ;;
    --python) ;;
    --demo) ;;  # the data set is always installed: the demo's test uses it
    *) echo "install_deps.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  [[ "$p" == \#* ]] && continue
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install_deps.sh: installing ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq >/dev/null
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install_deps.sh: done" >&2
