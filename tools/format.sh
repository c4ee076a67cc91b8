#!/usr/bin/env bash
# Formats the sources: BUILD, WORKSPACE and .bzl files with buildifier (the
# npm package @bazel/buildifier, which tools/setup.sh installs into
# ./node_modules), C and C++ with Debian's clang-format and the checked-in
# .clang-format.
#
#   bash tools/format.sh                    # every tracked file
#   bash tools/format.sh FILE...            # just these
#   bash tools/format.sh --check [FILE...]  # change nothing; list the files
#                                           # that need formatting, exit 1
#                                           # if there are any
set -euo pipefail
cd "$(dirname "$0")/.."

check=0
if [[ "${1:-}" == "--check" ]]; then
  check=1
  shift
fi

buildifier=node_modules/.bin/buildifier
if [[ ! -x "$buildifier" ]] || ! command -v clang-format >/dev/null; then
  echo "format: buildifier or clang-format missing; run: bash tools/setup.sh" >&2
  exit 2
fi

if (($#)); then
  files=("$@")
else
  mapfile -t files < <(git ls-files)
fi

build_files=()
cc_files=()
for f in "${files[@]}"; do
  [[ -f "$f" ]] || continue
  case "$f" in
    */BUILD | BUILD | */BUILD.bazel | BUILD.bazel | WORKSPACE | *.bzl)
      build_files+=("$f") ;;
    *.cc | *.h | *.c | *.cu)
      cc_files+=("$f") ;;
  esac
done

unformatted=()
if ((${#build_files[@]})); then
  if ((check)); then
    # Exit status 4 means "some files need reformatting"; they are listed.
    set +e
    out=$("$buildifier" -mode=check -lint=off "${build_files[@]}" 2>&1)
    rc=$?
    set -e
    if ((rc != 0 && rc != 4)); then
      echo "$out" >&2
      exit "$rc"
    fi
    while read -r f _; do
      [[ -n "$f" ]] && unformatted+=("$f")
    done <<<"$out"
  else
    "$buildifier" -mode=fix -lint=off "${build_files[@]}"
  fi
fi
for f in "${cc_files[@]}"; do
  if ((check)); then
    if ! clang-format --style=file --dry-run --Werror "$f" >/dev/null 2>&1; then
      unformatted+=("$f")
    fi
  else
    clang-format --style=file -i "$f"
  fi
done

if ((check)); then
  if ((${#unformatted[@]})); then
    printf 'format: needs formatting: %s\n' "${unformatted[@]}"
    echo "format: ${#unformatted[@]} file(s); run: bash tools/format.sh FILE..."
    exit 1
  fi
  echo "format: ${#build_files[@]} BUILD and ${#cc_files[@]} C/C++ files formatted"
fi
