#!/usr/bin/env bash
# The main job in containers (issue 17): tools/image.sh makes the worker image from this
# build's binaries (its Debian base is cached in podman's storage after the first run);
# three containers on this machine (host network, read-only root, /tmp a tmpfs, uid 1000)
# run fashion_mnist on a slice of Fashion-MNIST with the job token and TLS files mounted
# read-only, and all exit 0. Then a second job: one container is SIGKILLed mid-training,
# and the others fail with an error naming its worker, each within a bounded time.
#   tests/container_job_test.sh DRPC_WORKER FASHION_MNIST DRPC_LAUNCH IMAGE_SH
# Every container and the test image are removed at the end, pass or fail.
set -euo pipefail

bins=$(mktemp -d)
for b in "$1" "$2" "$3"; do cp "$(readlink -f "$b")" "$bins/"; done
image_sh=$4
tmp=${TEST_TMPDIR:-$(mktemp -d)}
label=drpc-container-test-$$
tag=localhost/drpc-worker:test-$$
podman=(podman --runtime=runc)
# Limits a container may have here (the defaults exceed what this sandbox grants runc).
limits=(--ulimit nofile=4096:4096 --ulimit nproc=4096:4096)

cleanup() {
  "${podman[@]}" ps -aq --filter "label=$label" | xargs -r "${podman[@]}" rm -f -t 0 >/dev/null 2>&1 || true
  "${podman[@]}" rmi -f "$tag" >/dev/null 2>&1 || true
  rm -rf "$bins"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for c in $("${podman[@]}" ps -aq --filter "label=$label"); do
    echo "--- $("${podman[@]}" inspect --format '{{.Name}}' "$c"):" >&2
    "${podman[@]}" logs "$c" 2>&1 | tail -15 >&2
  done
  exit 1
}

start=$SECONDS
"$image_sh" --binaries="$bins" --tag="$tag" | tail -1
echo "image built in $((SECONDS - start)) s"
help=$("${podman[@]}" run --rm "${limits[@]}" "$tag" --help 2>&1 || true)
[[ "$help" == *"drpc_worker --rank=R --world_size=N"* ]] || fail "the image's drpc_worker --help: $help"
[ "$("${podman[@]}" run --rm "${limits[@]}" --entrypoint /usr/bin/id "$tag" -u)" = 1000 ] || fail "the image does not run as uid 1000"
for tool in g++ cc bazel; do
  "${podman[@]}" run --rm "${limits[@]}" --entrypoint /bin/sh "$tag" -c "command -v $tool" >/dev/null && fail "the image holds $tool"
done

# The job's secrets, readable by the containers' user (uid 1000), mounted read-only.
secrets=$tmp/secrets
rm -rf "$secrets" && mkdir -p "$secrets"
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=drpc-test-ca -keyout "$secrets/ca.key" \
  -out "$secrets/ca.pem" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj /CN=drpc-worker -keyout "$secrets/worker.key" \
  -out "$secrets/worker.csr" 2>/dev/null
echo "subjectAltName=DNS:localhost,IP:127.0.0.1" > "$secrets/ext"
openssl x509 -req -in "$secrets/worker.csr" -CA "$secrets/ca.pem" -CAkey "$secrets/ca.key" -CAcreateserial \
  -days 2 -extfile "$secrets/ext" -out "$secrets/worker.pem" 2>/dev/null
rm -f "$secrets/ca.key" "$secrets/worker.csr" "$secrets/ext" "$secrets"/*.srl
head -c 24 /dev/urandom | base64 > "$secrets/token"
chmod 755 "$secrets" && chmod 644 "$secrets"/*

free_port() { /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# run_rank JOB RANK FLAGS...: starts rank RANK of a 3-worker job in the background.
run_rank() {
  local job=$1 rank=$2
  shift 2
  "${podman[@]}" run -d --name "$label-$job-$rank" --label "$label" --network=host \
    --read-only --tmpfs /tmp "${limits[@]}" \
    -v "$secrets:/etc/drpc:ro" \
    -e DRPC_RANK="$rank" -e DRPC_WORLD_SIZE=3 -e DRPC_MASTER_ADDR=127.0.0.1 -e DRPC_MASTER_PORT="$port" \
    -e DRPC_LISTEN=127.0.0.1 -e DRPC_TOKEN_FILE=/etc/drpc/token -e DRPC_TLS_CERT=/etc/drpc/worker.pem \
    -e DRPC_TLS_KEY=/etc/drpc/worker.key -e DRPC_TLS_CA=/etc/drpc/ca.pem -e GLOG_minloglevel=1 \
    --entrypoint /usr/local/bin/fashion_mnist "$tag" --log_every=4 "$@" >/dev/null
}
# exit_code NAME SECONDS: waits for the container to exit; prints its status ("timeout" if
# it did not exit in time).
exit_code() {
  timeout "$2" "${podman[@]}" wait "$1" 2>/dev/null || echo timeout
}
# logs NAME: the container's output so far. Read whole before grepping: `grep -q` on a pipe
# closes it at the first match, and podman's SIGPIPE would then fail the pipeline (pipefail).
logs() {
  "${podman[@]}" logs "$1" 2>&1 || true
}

# 1. A whole job: train on 1,024 images, test on 500; every container exits 0.
start=$SECONDS
port=$(free_port)
for r in 0 1 2; do run_rank ok "$r" --epochs=1 --limit=1024 --test_limit=500; done
for r in 0 1 2; do
  code=$(exit_code "$label-ok-$r" 150)
  [ "$code" = 0 ] || fail "job 1: worker$r exited $code"
done
log=$(logs "$label-ok-0")
[[ "$log" =~ epoch\ 1:\ train\ loss\ [0-9.]+,\ test\ accuracy\ [0-9.]+% ]] || fail "job 1: no epoch summary"
echo "${BASH_REMATCH[0]}"
ro=$("${podman[@]}" inspect --format '{{range .Mounts}}{{if eq .Destination "/etc/drpc"}}{{.RW}}{{end}}{{end}}' "$label-ok-1")
[ "$ro" = false ] || fail "the secrets are mounted read-write ($ro)"
echo "job 1: 3 containers exited 0 in $((SECONDS - start)) s"

# 2. worker1's container is SIGKILLed while the trainer is mid-epoch: the trainer and
# worker2 fail, naming worker1, well within the heartbeat window's bound (10 s) plus start-up.
start=$SECONDS
port=$(free_port)
for r in 0 1 2; do run_rank kill "$r" --epochs=1 --limit=60000 --test_limit=500; done
for _ in $(seq 1 300); do
  [[ "$(logs "$label-kill-0")" == *"step 8/"* ]] && break
  [ "$("${podman[@]}" inspect --format '{{.State.Running}}' "$label-kill-0")" = true ] || fail "job 2: trainer ended early"
  sleep 0.2
done
[[ "$(logs "$label-kill-0")" == *"step 8/"* ]] || fail "job 2: the trainer made no progress"
"${podman[@]}" kill --signal KILL "$label-kill-1" >/dev/null
killed=$SECONDS
for r in 0 2; do
  code=$(exit_code "$label-kill-$r" 60)
  [ "$code" != timeout ] || fail "job 2: worker$r still runs 60 s after worker1 was killed"
  [ "$code" != 0 ] || fail "job 2: worker$r exited 0 although worker1 was killed"
  out=$(logs "$label-kill-$r")
  [[ "$out" == *worker1* ]] || fail "job 2: worker$r's error does not name worker1"
  echo "job 2: worker$r exited $code $((SECONDS - killed)) s after the kill: $(printf '%s\n' "$out" | grep worker1 | tail -1)"
done
echo "job 2 took $((SECONDS - start)) s"
