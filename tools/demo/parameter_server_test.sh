#!/usr/bin/env bash
# The parameter-server example, small: a server and 2 trainers (real processes through
# the launcher) on 2,560 images; both trainers must finish and the shared model learn.
set -euo pipefail
out=$(GLOG_minloglevel=2 "$1" --nproc=3 -- "$2" --epochs=1 --limit=2560 2>&1)
echo "$out"
[ "$(echo "$out" | grep -c 'epoch 1: train loss')" -eq 2 ] || { echo "a trainer did not finish"; exit 1; }
accuracy=$(echo "$out" | grep -o 'test accuracy [0-9.]*' | awk '{print $3}')
awk -v a="${accuracy:-0}" 'BEGIN { exit !(a > 50) }' || { echo "accuracy ${accuracy:-none}% is not above 50%"; exit 1; }
echo "1 passed, 0 failed"
