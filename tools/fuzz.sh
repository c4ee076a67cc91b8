#!/usr/bin/env bash
# Runs every libFuzzer target (cc_fuzz_test, tagged fuzz_target) for a
# bounded time, built with --config=fuzz (clang, libFuzzer, ASan + UBSan).
#
#   bash tools/fuzz.sh                    # every target, 8 s each
#   bash tools/fuzz.sh --seconds=300 //server:dispatcher_fuzzer
#
# Each target starts from its checked-in corpus (testdata/fuzz/<target>/ in
# its package, read-only) and writes what it finds to a scratch corpus under
# $FUZZ_OUT (default: a temporary folder). A crash, a sanitizer report, a
# failed check, a timeout (--timeout s per input) or running out of memory
# stops that target; the reproducer is kept in $FUZZ_OUT and the script
# prints how to turn it into a regression test (copy it into the corpus as
# regression-<what>, fix the bug, and `bazel test` replays it forever).
# Exits 1 if any target failed, 3 if the targets do not build.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=8
timeout_s=10
targets=()
for arg in "$@"; do
  case "$arg" in
    --seconds=*) seconds=${arg#*=} ;;
    --timeout=*) timeout_s=${arg#*=} ;;
    -h | --help)
      sed -n '2,16p' "$0"
      exit 0
      ;;
    //*) targets+=("$arg") ;;
    *)
      echo "fuzz: unknown argument $arg" >&2
      exit 2
      ;;
  esac
done
if ((${#targets[@]} == 0)); then
  mapfile -t targets < <(bazel query --noshow_progress 'attr(tags, "fuzz_target", //...)' 2>/dev/null | sort)
fi
if ((${#targets[@]} == 0)); then
  echo "fuzz: no fuzz targets found" >&2
  exit 1
fi

out=${FUZZ_OUT:-$(mktemp -d /tmp/downpour-fuzz.XXXXXX)}
mkdir -p "$out"
echo "fuzz: building ${#targets[@]} targets with --config=fuzz (log $out/build.log)"
# The log only: gold warns about every ASan helper it cannot export.
if ! bazel build --config=fuzz "${targets[@]}" >"$out/build.log" 2>&1; then
  grep -E 'ERROR|error:' "$out/build.log" | head -n 40 >&2
  echo "fuzz: build failed; see $out/build.log" >&2
  exit 3
fi
bin=$(bazel info --config=fuzz bazel-bin 2>/dev/null)

failed=()
for t in "${targets[@]}"; do
  pkg=${t#//}
  pkg=${pkg%%:*}
  name=${t##*:}
  seeds="$pkg/testdata/fuzz/$name"
  scratch="$out/$name/corpus"
  mkdir -p "$scratch"
  log="$out/$name/log"
  echo "fuzz: $t for ${seconds}s (corpus $seeds, log $log)"
  set +e
  # -rss_limit_mb bounds a run's memory (libFuzzer reports going over it as
  # a failure); -timeout bounds one input.
  "$bin/$pkg/$name" -max_total_time="$seconds" -timeout="$timeout_s" \
    -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$out/$name/" "$scratch" "$seeds" >"$log" 2>&1
  rc=$?
  set -e
  grep -E '^stat::number_of_executed_units|^stat::new_units_added' "$log" |
    sed 's/^/      /' || true
  if ((rc != 0)); then
    failed+=("$t")
    echo "fuzz: $t FAILED (exit $rc); the end of its log:" >&2
    tail -n 40 "$log" >&2
    for a in "$out/$name"/crash-* "$out/$name"/leak-* "$out/$name"/timeout-* "$out/$name"/oom-*; do
      [[ -e "$a" ]] || continue
      echo "fuzz: reproducer $a" >&2
      echo "      replay:     $bin/$pkg/$name $a" >&2
      echo "      regression: cp $a $seeds/regression-<what>  (then fix, and bazel test $t)" >&2
    done
  fi
done

if ((${#failed[@]})); then
  echo "fuzz: ${#failed[@]} of ${#targets[@]} targets failed: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: ${#targets[@]} targets ran clean for ${seconds}s each (scratch corpora in $out)"
