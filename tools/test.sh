#!/usr/bin/env bash
# Runs the whole test suite (the README's test command; .ci/run calls it):
#   0. format: tools/format.sh --check (clang-format, buildifier): a file
#              that needs formatting fails the command;
#   1. plain:  every test target (bazel test //...);
#   2. tsan:   the tests of the concurrent parts, and integration tests that
#              drive the client, under ThreadSanitizer (--config=tsan);
#   3. fuzz:   every libFuzzer target for FUZZ_SECONDS (default 8) seconds
#              each (tools/fuzz.sh; about a minute in all); its new
#              findings are reported, and fail the command with FUZZ_GATE=1;
#   4. asan:   the small and medium test targets again under
#              AddressSanitizer + UndefinedBehaviorSanitizer (--config=asan):
#              every unit test, every fuzz corpus and the medium integration
#              tests;
#   5. asan-large: the large test targets under ASan + UBSan (training
#              runs, failover, Sandblaster and PyTorch jobs), so that
#              together the two cover every test (//deploy/... aside: the
#              manifests and a podman image have no code of ours).
# Stages 2-5 run within a time budget (below).
# Installs what is missing first, prints how long each stage took, and
# exits non-zero if any stage failed (after running the others).
#
#   bash tools/test.sh                  # all five stages
#   bash tools/test.sh --quick          # the format and plain stages only
#   bash tools/test.sh --sanitize-all   # stages 4 and 5 as one
# Other arguments are passed to every `bazel test`.
#
# Why the large tests have a stage of their own, the last: they take
# minutes plain and several times that under ASan. On a quiet machine the
# stage took 16 minutes with its build (tests/sandblaster_test alone 232 s);
# on a loaded one a single test has taken a quarter of an hour. So it is
# the stage the budget cuts when the cache is cold; the disk cache keeps
# the results of unchanged tests, and a warm run goes through it whole.
# The Python and SDK tests load our code into a program that is not built
# with the sanitizers (Debian's python3, an example built by cmake); they
# preload the ASan runtime there themselves (python/tests/pytest_main.py,
# sdk/install_test.sh), since ASan must come first.
#
# A time budget keeps the whole command inside CI's limit whatever the
# machine: TEST_BUDGET_MIN (default 80, of CI's 90) counts from the start,
# set-up included. After the plain stage, each sanitizer stage runs only if
# at least 10 minutes remain, and is interrupted when the budget is spent;
# such a stage is reported as "cut at the time budget" (what it ran is
# printed above it), not as a failure. The plain stage always runs whole.
# Order: TSan (a list of targets), fuzz (a minute), ASan, ASan large.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh

budget_s=$(( ${TEST_BUDGET_MIN:-80} * 60 ))
quick=0
asan_sizes=(--test_size_filters=small,medium)
args=()
for a in "$@"; do
  case "$a" in
    --quick) quick=1 ;;
    --sanitize-all) asan_sizes=() ;;
    *) args+=("$a") ;;
  esac
done

# The concurrent parts (issue 11): transport, dispatcher and table shard,
# scheduler, consistency clocks, the buffer pool and the L-BFGS task pool;
# a job member's heartbeat thread against Leave; the data-plane client
# through the cluster and model tests (it has no unit test of its own),
# plus the check that TSan sees through Debian's Abseil.
TSAN_TARGETS=(
  //transport:transport_test
  //server:dispatcher_test
  //server:range_store_test
  //server:sparse_rows_test
  //storage:cold_store_test
  //tests:bounded_table_test
  //server:zero_copy_pull_test
  //scheduler:scheduler_test
  //scheduler:scheduler_process_test
  //client:job_member_test
  //consistency:consistency_test
  //common:buffer_pool_test
  //common:signals_test
  //lbfgs:task_pool_test
  //tools/sanitizers:tsan_absl_test
  //tests:cluster_test
  //tests:model_test
)

log=$(mktemp)
trap 'rm -f "$log"' EXIT
summary=()
failed=0
passed_total=0
failed_total=0

# run NAME COMMAND...: runs a stage, records its time and outcome.
run() {
  local name=$1
  shift
  echo "test: stage $name: $*"
  local start=$SECONDS rc
  set +e
  "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  set -e
  local p f
  last_failed=0
  p=$(grep -cE '^//.* PASSED' "$log" || true)
  f=$(grep -cE '^//.* (FAILED|TIMEOUT|NO STATUS)' "$log" || true)
  last_failed=$f
  passed_total=$((passed_total + p))
  failed_total=$((failed_total + f))
  local secs=$((SECONDS - start))
  local verdict=ok
  if ((rc != 0)); then
    verdict="FAILED (exit $rc)"
    failed=1
  fi
  local counts=""
  # (An `((...))` that is false inside the assignment would end the script
  # under set -e, e.g. after the fuzz stage, which runs no bazel tests.)
  if ((p + f > 0)); then counts=", $p passed, $f failed"; fi
  summary+=("$(printf '%-6s %4dm%02ds  %s' "$name" $((secs / 60)) $((secs % 60)) "$verdict")$counts")
}

# budgeted NAME COMMAND...: `run` within what is left of the budget.
budgeted() {
  local name=$1
  shift
  local left=$((budget_s - SECONDS))
  if ((left < 600)); then
    summary+=("$(printf '%-6s  skipped: %dm of the time budget left' "$name" $((left / 60)))")
    return
  fi
  run "$name" timeout -s INT -k 60 "$left" "$@"
  if [[ ${summary[-1]} == *"exit 124"* ]]; then
    summary[-1]="${summary[-1]/FAILED (exit 124)/cut at the time budget}"
    # Tests the interruption left without a result are not failures.
    failed_total=$((failed_total - last_failed))
    failed=$cut_failed
  fi
}

# Formatting is a gate: an unformatted file fails the command (the
# stage lists it and the command that fixes it), and the tests still run.
run format bash tools/format.sh --check
run plain bazel test //... "${args[@]}"
if ((!quick)); then
  for stage in tsan fuzz asan asan-large; do
    cut_failed=$failed
    case $stage in
      tsan) budgeted tsan bazel test --config=tsan "${TSAN_TARGETS[@]}" "${args[@]}" ;;
      fuzz)
        budgeted fuzz bash tools/fuzz.sh --seconds="${FUZZ_SECONDS:-8}"
        # New findings are reported (with reproducers, above) but do not
        # fail the command unless FUZZ_GATE=1: what a random search finds in
        # 8 s differs from run to run, while every input kept in a corpus
        # is replayed, and gates, in the plain stage.
        # A fuzzer that does not build (fuzz.sh exits 3) fails the stage.
        if [[ ${FUZZ_GATE:-0} != 1 && ${summary[-1]} == *FAILED* &&
              ${summary[-1]} != *"exit 3"* ]]; then
          summary[-1]="${summary[-1]/FAILED/found new inputs (not gating; FUZZ_GATE=1 gates)}"
          failed=$cut_failed
        fi
        ;;
      asan) budgeted asan bazel test --config=asan "${asan_sizes[@]}" \
        "${args[@]}" -- //... -//deploy/... ;;
      asan-large)
        # --sanitize-all ran them in the stage above already.
        ((${#asan_sizes[@]} == 0)) && continue
        budgeted asan-large bazel test --config=asan \
          --test_size_filters=large,enormous --test_timeout=3600 \
          "${args[@]}" -- //... -//deploy/... ;;
    esac
  done
fi

echo "test: summary (load average $(cut -d' ' -f1-3 /proc/loadavg))"
for line in "${summary[@]}"; do echo "  $line"; done
echo "tests: ${passed_total} passed, ${failed_total} failed"
exit "$failed"
