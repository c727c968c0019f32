#!/usr/bin/env bash
# Installs what is missing, builds and runs every test, and ends with a line
# "N passed, N failed" counting the test cases that Bazel's results report.
#   tools/test.sh                      all tests
#   tools/test.sh //process_group/...  some of them (any bazel test arguments; //... when
#                                      no target pattern is given)
#   tools/test.sh --config=asan        under AddressSanitizer (+ LeakSanitizer); likewise tsan
# With CI set (and no --config given), the suite runs twice: as usual, then under
# --config=asan. Each run prints its own "N passed, N failed" line; the last line is the total.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
tools/install_deps.sh || exit 1

# Split the arguments into Bazel flags and target patterns (//x/..., x:y, x/...; anything
# after --). A flag's value given as a separate word must not look like a pattern.
flags=() targets=() config=""
after_dashdash=0
for a in "$@"; do
  if [ $after_dashdash -eq 1 ]; then targets+=("$a"); continue; fi
  case "$a" in
    --) after_dashdash=1 ;;
    --config=*) config="${a#--config=}"; flags+=("$a") ;;
    -//*) targets+=("$a") ;;  # an excluded pattern
    -*) flags+=("$a") ;;
    //* | @* | :* | */* | *:* | *...) targets+=("$a") ;;
    *) flags+=("$a") ;;
  esac
done
positive=0
for t in "${targets[@]}"; do [[ "$t" != -* ]] && positive=1; done
[ $positive -eq 0 ] && targets=(//... "${targets[@]}")  # nothing named, or only exclusions
# "--config asan" (value as its own word) counts too.
for ((i = 0; i + 1 < ${#flags[@]}; i++)); do
  [ "${flags[$i]}" = --config ] && config="${flags[$((i + 1))]}"
done

# In CI every test really runs: results from Bazel's disk cache would hide a flaky test.
cache_flags=()
[ -n "${CI:-}" ] && cache_flags=(--cache_test_results=no)

# Flags a sanitizer configuration needs at run time (sets sanitizer_flags): suppression
# files by absolute path, since multi-process tests start workers from other directories
# (the workers inherit the environment). The rest of each configuration is in .bazelrc.
sanitizer_flags=()
set_sanitizer_flags() {
  local supp="'$root/tools/sanitizers"
  case "$1" in
    asan) sanitizer_flags=("--test_env=LSAN_OPTIONS=suppressions=$supp/lsan.supp':print_suppressions=0") ;;
    # ignore_noninstrumented_modules and history_size: see tools/sanitizers/tsan.supp.
    tsan) sanitizer_flags=("--test_env=TSAN_OPTIONS=suppressions=$supp/tsan.supp':ignore_noninstrumented_modules=1:history_size=6:second_deadlock_stack=1") ;;
    *) sanitizer_flags=() ;;
  esac
}

# Counts test cases from the JUnit XML of each target a run reported.
attr() { echo "$1" | grep -o "$2=\"[0-9]*\"" | grep -o '[0-9]*' || echo 0; }
count() {  # count LOG TESTLOGS: sets passed, failed, skipped
  local log="$1" testlogs="$2" target result xml head tests bad skip
  passed=0 failed=0 skipped=0
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
    # A binary that crashed after its last recorded case (a sanitizer report at exit)
    # still fails its target.
    [ "$result" != PASSED ] && [ "$bad" -eq 0 ] && bad=1
    failed=$((failed + bad))
    skipped=$((skipped + skip))
    passed=$((passed + tests - bad - skip))
  done < <(grep -E '^//[^ ]+ +(\(cached\) )?(PASSED|FAILED|TIMEOUT|FLAKY|NO STATUS|INCOMPLETE)' "$log" |
           sed -E 's/ +\(cached\)//; s/^(\/\/[^ ]+) +([A-Z ]+[A-Z]).*/\1 \2/')
  [ $passed -lt 0 ] && passed=0
}

summary() {  # summary PASSED FAILED SKIPPED [LABEL]
  local line="$1 passed, $2 failed"
  [ "$3" -gt 0 ] && line="$line, $3 skipped"
  echo "$line${4:+ ($4)}"
}

log=$(mktemp)
trap 'rm -f "$log"' EXIT
total_passed=0 total_failed=0 total_skipped=0 final_status=0
run() {  # run CONFIG FLAGS...: one bazel test over the targets, counted
  local cfg="$1" status
  shift
  set_sanitizer_flags "$cfg"
  local start=$SECONDS
  bazel test "${cache_flags[@]}" "$@" "${sanitizer_flags[@]}" -- "${targets[@]}" 2>&1 | tee "$log"
  status=${PIPESTATUS[0]}
  count "$log" "$(bazel info "$@" bazel-testlogs 2>/dev/null)"
  if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi  # a build error fails the run
  total_passed=$((total_passed + passed))
  total_failed=$((total_failed + failed))
  total_skipped=$((total_skipped + skipped))
  [ "$status" -ne 0 ] && final_status=$status
  label="${cfg:-default} configuration, $((SECONDS - start)) s"
}

run "$config" "${flags[@]}"
if [ -n "${CI:-}" ] && [ -z "$config" ]; then
  summary $passed $failed $skipped "$label"
  # The container job packs the binaries into an image: with ASan's it would test nothing more.
  targets+=(-//tests:container_job_test)
  run asan "${flags[@]}" --config=asan
  summary $passed $failed $skipped "$label"
  summary $total_passed $total_failed $total_skipped  # the total, as the last line
else
  summary $passed $failed $skipped
fi
exit "$final_status"
