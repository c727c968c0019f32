#!/usr/bin/env bash
# The parameter-server example, small: a server and 2 trainers (real processes through
# the launcher) on 2,560 images; both trainers must finish and the shared model learn.
set -euo pipefail
out=$(GLOG_minloglevel=2 "$1" --nproc=3 -- "$2" --epochs=1 --limit=2560 2>&1)
echo "$out"
[ "$(echo "$out" | grep -c 'epoch 1: train loss')" -eq 2 ] || { echo "a trainer did not finish"; exit 1; }
# 2 trainers x 1,280 images / 64 per batch: the accuracy is of the model with all 40 updates.
grep -q 'test accuracy [0-9.]*% after 40 updates' <<<"$out" || { echo "the accuracy was not taken after all 40 updates"; exit 1; }
accuracy=$(echo "$out" | grep -o 'test accuracy [0-9.]*' | awk '{print $3}')
awk -v a="${accuracy:-0}" 'BEGIN { exit !(a > 50) }' || { echo "accuracy ${accuracy:-none}% is not above 50%"; exit 1; }
echo "1 passed, 0 failed"
