#!/usr/bin/env bash
# Three workers, each in its own network namespace with its own address on a veth
# bridge (the bridge lives in a fourth namespace: nothing touches the host's network).
# A job spanning them works; cutting worker2's link gives worker0 a clear error within
# the call's timeout while worker1 keeps answering. Needs root and iproute2.
#   netns_test.sh WORKER [ucx]
# With "ucx" the workers ask for the UCX data plane and may use only UCX's TCP transport, so
# their frames cross the bridge on UCX links (checked in their logs); otherwise they use the
# default (auto: gRPC, the namespaces counting as other hosts).
set -uo pipefail
worker="$1"
plane="${2:-auto}"
verbosity=(GLOG_minloglevel=1)
if [ "$plane" = ucx ]; then
  export DRPC_DATA_PLANE=ucx UCX_TLS=tcp
  verbosity=(GLOG_minloglevel=0 GLOG_v=1)
fi
tag="d$$"
dir="${TEST_TMPDIR:-/tmp}/netns.$$"
mkdir -p "$dir"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  for n in sw w0 w1 w2; do ip netns del "$tag$n" 2>/dev/null; done
}
trap cleanup EXIT
set -e
ip netns add "${tag}sw"
ip -n "${tag}sw" link add br0 type bridge
ip -n "${tag}sw" link set br0 up
for i in 0 1 2; do
  ip netns add "${tag}w$i"
  ip link add "${tag}v$i" type veth peer name "${tag}p$i"
  ip link set "${tag}v$i" netns "${tag}w$i"
  ip link set "${tag}p$i" netns "${tag}sw"
  ip -n "${tag}sw" link set "${tag}p$i" master br0 up
  ip -n "${tag}w$i" addr add "10.213.$(( $$ % 250 )).$((i + 1))/24" dev "${tag}v$i"
  ip -n "${tag}w$i" link set "${tag}v$i" up
  ip -n "${tag}w$i" link set lo up
done
net="10.213.$(( $$ % 250 ))"
set +e
for i in 0 1 2; do
  env "${verbosity[@]}" ip netns exec "${tag}w$i" "$worker" --rank=$i --world_size=3 --scenario=netns \
    --master_addr="$net.1" --store_port=29500 --listen="$net.$((i + 1))" --sync_dir="$dir" 2>"$dir/w$i.log" &
  pids+=($!)
done
for _ in $(seq 600); do [ -e "$dir/ready" ] && break; kill -0 "${pids[0]}" 2>/dev/null || break; sleep 0.1; done
[ -e "$dir/ready" ] || { echo "the job did not come up across namespaces"; exit 1; }
ip -n "${tag}sw" link set "${tag}p2" down   # cut worker2 off
touch "$dir/cut"
wait "${pids[0]}"
status=$?
[ "$status" -eq 0 ] || { echo "worker0 failed ($status)"; grep -v "^I" "$dir/w0.log"; exit 1; }
if [ "$plane" = ucx ]; then
  for r in 1 2; do
    grep -q "frames to rank $r go over UCX" "$dir/w0.log" ||
      { echo "worker0's frames to rank $r did not go over UCX:"; grep "rank $r" "$dir/w0.log" | head; exit 1; }
  done
fi
echo "1 passed, 0 failed"
