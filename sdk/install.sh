#!/usr/bin/env bash
# Installs the client SDK under a prefix:
#   PREFIX/lib/libdownpour.so.0 (+ the libdownpour.so link)
#   PREFIX/include/downpour/{client,common,consistency}/*.h
#   PREFIX/lib/pkgconfig/downpour.pc
#
#   bazel run //sdk:install -- --prefix=/usr/local
#   bazel-bin/sdk/install --prefix=$HOME/.local
#
# A relative prefix is taken from the directory bazel run was called in.
set -euo pipefail

prefix=""
for arg in "$@"; do
  case "$arg" in
    --prefix=*) prefix="${arg#--prefix=}" ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "install: unknown argument '$arg' (--prefix=DIR)" >&2; exit 2 ;;
  esac
done
if [[ -z "$prefix" ]]; then
  echo "install: --prefix=DIR is required" >&2
  exit 2
fi
if [[ "$prefix" != /* ]]; then
  prefix="${BUILD_WORKING_DIRECTORY:-$PWD}/$prefix"
fi

# The files travel as runfiles: next to this script (bazel-bin) or in the
# runfiles tree that bazel run / bazel test give.
if [[ -n "${RUNFILES_DIR:-}" ]]; then
  root="$RUNFILES_DIR/downpour"
elif [[ -d "$0.runfiles/downpour" ]]; then
  root="$0.runfiles/downpour"
else
  root="$(cd "$(dirname "$0")/.." && pwd)"  # sdk/install.sh inside runfiles
fi
for f in sdk/libdownpour.so sdk/downpour.pc.in client/client.h \
         client/job_member.h common/auth.h common/types.h \
         consistency/consistency.h; do
  if [[ ! -f "$root/$f" ]]; then
    echo "install: $root/$f is missing (bazel build //sdk:install first)" >&2
    exit 1
  fi
done

mkdir -p "$prefix/lib/pkgconfig" "$prefix/include/downpour/client" \
         "$prefix/include/downpour/common" \
         "$prefix/include/downpour/consistency"
install -m 0755 "$root/sdk/libdownpour.so" "$prefix/lib/libdownpour.so.0"
ln -sf libdownpour.so.0 "$prefix/lib/libdownpour.so"
install -m 0644 "$root/client/client.h" "$root/client/job_member.h" \
        "$prefix/include/downpour/client/"
install -m 0644 "$root/consistency/consistency.h" \
        "$prefix/include/downpour/consistency/"
install -m 0644 "$root/common/auth.h" "$root/common/types.h" \
        "$prefix/include/downpour/common/"
sed "s|@PREFIX@|$prefix|" "$root/sdk/downpour.pc.in" \
    > "$prefix/lib/pkgconfig/downpour.pc"
chmod 0644 "$prefix/lib/pkgconfig/downpour.pc"
echo "install: SDK installed under $prefix (pkg-config: $prefix/lib/pkgconfig)"
