#!/usr/bin/env bash
# Builds the worker image drpc-worker:<git describe> (and :<VERSION>) with podman, pulling
# from no registry: a Debian 12 base made by mmdebstrap from Debian's archive (the host's
# apt sources) holding only the runtime libraries the binaries link and the Fashion-MNIST
# data, then one layer with drpc_worker, fashion_mnist and drpc_launch (built here by Bazel,
# -c opt) and an unprivileged user (uid 1000). No compiler, no -dev package, no Bazel.
#   tools/image.sh                        build the binaries and the image; print its name and size
#   tools/image.sh --binaries=DIR         use DIR's drpc_worker, fashion_mnist, drpc_launch (tests)
#   tools/image.sh --tag=NAME:TAG         tag it so instead (tests: the user's images stay as they are)
# The base is cached in podman's storage under a name derived from its package list, so a
# rebuild after a code change only adds the binaries' layer. Prints "image NAME SIZE" last.
# deploy/Dockerfile builds the same image with docker (compiling inside a build stage).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
binaries="" extra_tag=""
for arg in "$@"; do
  case "$arg" in
    --binaries=*) binaries=$(readlink -f "${arg#--binaries=}") ;;
    --tag=*) extra_tag="${arg#--tag=}" ;;
    *) echo "image.sh: unknown option $arg (see the comment at the top)" >&2; exit 2 ;;
  esac
done
tools/install_deps.sh
podman=(podman --runtime=runc)

programs=(drpc_worker fashion_mnist drpc_launch)
if [ -z "$binaries" ]; then
  bazel build -c opt //tools/worker:drpc_worker //tools/demo:fashion_mnist //tools/launch:drpc_launch >&2
  bin=$(bazel info -c opt bazel-bin 2>/dev/null)
  binaries=$(mktemp -d)
  trap 'rm -rf "$binaries"' EXIT
  cp "$bin/tools/worker/drpc_worker" "$bin/tools/demo/fashion_mnist" "$bin/tools/launch/drpc_launch" "$binaries/"
fi
for p in "${programs[@]}"; do
  [ -x "$binaries/$p" ] || { echo "image.sh: $binaries/$p is missing" >&2; exit 1; }
done

# The runtime packages: those owning the libraries the binaries load, and the data set.
libraries=$(tools/image_packages.sh "${programs[@]/#/$binaries/}")
packages=$(printf '%s\ndataset-fashion-mnist\n' "$libraries" | sort -u | tr '\n' ',' | sed 's/,$//')

# The base's name says what it holds: rebuilt only when the package list or this recipe changes.
recipe_hash=$( (echo "$packages"; sed -n '/^  # base recipe/,/^  # end of base recipe/p' "$0"; cat tools/image_prune_hook.sh) | sha256sum | cut -c1-12)
base="localhost/drpc-runtime-base:$recipe_hash"
if ! "${podman[@]}" image exists "$base"; then
  echo "image.sh: making the Debian 12 base: $(echo "$packages" | tr , "\n" | wc -l) packages, from Debian's archive" >&2
  tar=$(mktemp --suffix=.tar)
  # The host's apt sources (its mirror, security updates): Debian's archive as apt sees it here.
  sources=()
  for f in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list; do
    [ -s "$f" ] && { sources=("$f"); break; }
  done
  # base recipe
  # minbase: Essential packages and apt; then the packages owning the libraries the
  # binaries load. Their own dependencies that the loader never maps (Mesa's drivers and
  # LLVM behind libGL, perl, ...) come along by apt's rules: tools/image_prune_hook.sh
  # removes their files (ldd lists the whole closure of what the binaries load). No
  # documentation, manuals or translations; no apt lists or package cache left behind. The
  # user drpc (1000) runs the programs.
  DRPC_IMAGE_KEEP="${packages//,/ }" \
  mmdebstrap --quiet --variant=minbase --include="$packages" \
    --aptopt='Acquire::Check-Valid-Until "false"' \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --essential-hook='dpkg-query --admindir="$1/var/lib/dpkg" -W -f="\${Package}\n" > "$1/tmp/minbase-packages"' \
    --customize-hook="$root/tools/image_prune_hook.sh" \
    --customize-hook='echo "drpc:x:1000:1000:drpc worker:/nonexistent:/usr/sbin/nologin" >> "$1/etc/passwd"' \
    --customize-hook='echo "drpc:x:1000:" >> "$1/etc/group"' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/* "$1"/tmp/*' \
    bookworm "$tar" "${sources[@]}"
  # end of base recipe
  "${podman[@]}" import --quiet "$tar" "$base" >/dev/null
  rm -f "$tar"
fi

version=$(cat VERSION 2>/dev/null || echo 0.0.0)
tag="drpc-worker:$(git describe --tags --always --dirty 2>/dev/null || echo "$version")"
context=$(mktemp -d)
mkdir "$context/bin"
cp "${programs[@]/#/$binaries/}" "$context/bin/"
strip --strip-unneeded "$context"/bin/* 2>/dev/null || true
tags=(-t "$tag" -t "drpc-worker:$version")
[ -n "$extra_tag" ] && tag=$extra_tag && tags=(-t "$extra_tag")
"${podman[@]}" build --quiet --pull=never --isolation=chroot --build-arg "BASE=$base" \
  -f "$root/deploy/Containerfile" "${tags[@]}" "$context" >/dev/null
rm -rf "$context"
size=$("${podman[@]}" image inspect --format '{{.Size}}' "$tag")
echo "image ${tag#localhost/} $((size / 1000000)) MB"
