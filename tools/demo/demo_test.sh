#!/usr/bin/env bash
# The main job, small: 3 real worker processes through the launcher train on 1,280
# Fashion-MNIST images for one epoch; the run must finish, report a test accuracy, and
# learn (accuracy above chance by a wide margin).
set -euo pipefail
launch="$1"
demo="$2"
out=$(GLOG_minloglevel=2 "$launch" --nproc=3 -- "$demo" --epochs=1 --limit=1280 --test_limit=1000 2>&1)
echo "$out"
accuracy=$(echo "$out" | grep -o 'test accuracy [0-9.]*' | tail -1 | awk '{print $3}')
[ -n "$accuracy" ] || { echo "no test accuracy reported"; exit 1; }
awk -v a="$accuracy" 'BEGIN { exit !(a > 50) }' || { echo "accuracy $accuracy% is not above 50%"; exit 1; }
echo "1 passed, 0 failed"
