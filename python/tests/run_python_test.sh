#!/usr/bin/env bash
# Runs a Python test file with /usr/bin/python3 (the interpreter with Debian's torch) and
# the drpc package from this test's runfiles.
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
export PYTHONPATH="${root}/python${PYTHONPATH:+:${PYTHONPATH}}"
export PYTHONUNBUFFERED=1
export GLOG_minloglevel="${GLOG_minloglevel:-1}"
# Under --config=asan/tsan the extension is instrumented, and the sanitizer's runtime must
# be loaded before anything else: preload it into the (uninstrumented) interpreter, whose
# own allocations at exit are not drpc's leaks.
module="${root}/python/drpc/_drpc.so"
# Read whole before grep -q looks at it: grep exits at its first match, and a writer still
# writing into the pipe would die of SIGPIPE and (pipefail) turn the match into a miss.
dynamic=$(readelf -d "$module" 2>/dev/null || true)
for runtime in asan tsan; do
  if grep -q "lib${runtime}\.so" <<<"$dynamic"; then
    lib=$(ldd "$module" | awk -v r="lib${runtime}.so" 'index($1, r) == 1 { print $3 }')
    # With libstdc++, which the C interpreter does not load itself: the runtime intercepts
    # __cxa_throw only in libraries present when it starts.
    cxx=$(ldd "$module" | awk 'index($1, "libstdc++.so") == 1 { print $3 }')
    export LD_PRELOAD="${lib}:${cxx}${LD_PRELOAD:+:${LD_PRELOAD}}"
    [ "$runtime" = asan ] && export ASAN_OPTIONS="${ASAN_OPTIONS:+${ASAN_OPTIONS}:}detect_leaks=0"
  fi
done
exec /usr/bin/python3 "${root}/$1" "${@:2}"
