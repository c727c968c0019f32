#!/usr/bin/env bash
# Installs what is missing, builds and runs every test, and ends with a line
# "N passed, N failed" counting the test cases that Bazel's results report.
#   tools/test.sh                      all tests
#   tools/test.sh //process_group/...  some of them (any bazel test arguments)
set -uo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh || exit 1

targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(//...)

log=$(mktemp)
trap 'rm -f "$log"' EXIT
# In CI every test really runs: results from Bazel's disk cache would hide a flaky test.
cache_flags=()
[ -n "${CI:-}" ] && cache_flags=(--cache_test_results=no)
bazel test "${cache_flags[@]}" "${targets[@]}" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}

# Count test cases from the JUnit XML of each target this run reported.
attr() { echo "$1" | grep -o "$2=\"[0-9]*\"" | grep -o '[0-9]*' || echo 0; }
passed=0 failed=0 skipped=0
testlogs=$(bazel info bazel-testlogs 2>/dev/null)
while read -r target result; do
  xml="$testlogs/$(echo "${target#//}" | tr ':' '/')/test.xml"
  head=$( [ -f "$xml" ] && grep -m1 -o '<testsuites[^>]*>' "$xml" || true)
  # Bazel's own XML (sh_test) puts the counts on <testsuite>, not <testsuites>.
  if [ -n "$head" ] && ! echo "$head" | grep -q 'tests="'; then
    head=$(grep -m1 -o '<testsuite [^>]*>' "$xml" || true)
  fi
  if [ -z "$head" ]; then  # no per-case results: the target counts as one case
    if [ "$result" = PASSED ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
    continue
  fi
  tests=$(attr "$head" tests)
  bad=$(( $(attr "$head" failures) + $(attr "$head" errors) ))
  skip=$(( $(grep -c '<skipped' "$xml" || true) + $(attr "$head" disabled) ))
  # A binary that crashed after its last recorded case still fails its target.
  [ "$result" != PASSED ] && [ "$bad" -eq 0 ] && bad=1
  failed=$((failed + bad))
  skipped=$((skipped + skip))
  passed=$((passed + tests - bad - skip))
done < <(grep -E '^//[^ ]+ +(\(cached\) )?(PASSED|FAILED|TIMEOUT|FLAKY|NO STATUS|INCOMPLETE)' "$log" |
         sed -E 's/ +\(cached\)//; s/^(\/\/[^ ]+) +([A-Z ]+[A-Z]).*/\1 \2/')

[ $passed -lt 0 ] && passed=0
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi  # a build error fails the run
if [ $skipped -gt 0 ]; then
  echo "$passed passed, $failed failed, $skipped skipped"
else
  echo "$passed passed, $failed failed"
fi
exit "$status"
