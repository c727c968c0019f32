#!/usr/bin/env bash
# Runs a Python test file with /usr/bin/python3 (the interpreter with Debian's torch) and
# the drpc package from this test's runfiles.
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
export PYTHONPATH="${root}/python${PYTHONPATH:+:${PYTHONPATH}}"
export PYTHONUNBUFFERED=1
export GLOG_minloglevel="${GLOG_minloglevel:-1}"
exec /usr/bin/python3 "${root}/$1" "${@:2}"
