#!/usr/bin/env bash
# The main job, small: 3 real worker processes through the launcher train on 1,280
# Fashion-MNIST images for one epoch; the run must finish, report a test accuracy, and
# learn (accuracy above chance by a wide margin). --profile writes one step's trace, which
# must show every worker and the step's parts.
set -euo pipefail
launch="$1"
demo="$2"
trace="${TEST_TMPDIR:-/tmp}/demo_step_trace.json"
rm -f "$trace"
out=$(GLOG_minloglevel=2 "$launch" --nproc=3 -- "$demo" --epochs=1 --limit=1280 --test_limit=1000 \
  --profile="$trace" --log_every=10 2>&1)
echo "$out"
# Not a terminal: a line per 10 steps (20 steps of 64), no progress bar redrawn with \r.
grep -q '^\[rank 0\] epoch 1 step 10/20 loss ' <<<"$out" || { echo "no progress line for step 10"; exit 1; }
grep -q '^\[rank 0\] epoch 1 step 20/20 loss ' <<<"$out" || { echo "no progress line for step 20"; exit 1; }
if grep -q $'\r' <<<"$out"; then echo "a progress bar was drawn into a pipe"; exit 1; fi
accuracy=$(echo "$out" | grep -o 'test accuracy [0-9.]*' | tail -1 | awk '{print $3}')
[ -n "$accuracy" ] || { echo "no test accuracy reported"; exit 1; }
awk -v a="$accuracy" 'BEGIN { exit !(a > 50) }' || { echo "accuracy $accuracy% is not above 50%"; exit 1; }
[ -s "$trace" ] || { echo "no trace written to $trace"; exit 1; }
for part in '"traceEvents":[' '"args":{"name":"worker0"}' '"args":{"name":"worker1"}' '"args":{"name":"worker2"}' \
    '"name":"demo.block","cat":"rpc"' '"name":"demo.block","cat":"execute"' \
    '"name":"distributed backward","cat":"execute"' '"name":"drpc.optim.step","cat":"rpc"' \
    '"name":"release of autograd context","cat":"rpc"' '"cat":"network"' '"cat":"queue"'; do
  grep -qF "$part" "$trace" || { echo "the trace lacks $part"; head -c 3000 "$trace"; exit 1; }
done
echo "1 passed, 0 failed"
