#!/usr/bin/env bash
# Installs the SDK into a temporary prefix, builds sdk/example with plain g++
# (flags from pkg-config) and with CMake, outside the workspace, and runs
# both against a real scheduler and server on 127.0.0.1.
set -euo pipefail

root="$PWD"  # the runfiles root of the workspace
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
prefix="$tmp/prefix"
fail() { echo "FAIL: $*" >&2; exit 1; }

bash "$root/sdk/install.sh" --prefix="$prefix"
for f in lib/libdownpour.so lib/libdownpour.so.0 lib/pkgconfig/downpour.pc \
         include/downpour/client/client.h include/downpour/client/job_member.h \
         include/downpour/common/auth.h include/downpour/common/types.h \
         include/downpour/consistency/consistency.h; do
  [[ -e "$prefix/$f" ]] || fail "$prefix/$f not installed"
done
# Only namespace downpour is exported.
exported=$(nm -D --defined-only -C "$prefix/lib/libdownpour.so.0" | awk '{$1=$2=""; print}')
for sym in 'downpour::Client::Connect' 'downpour::JobMember::Join' \
           'downpour::ClusterAuth::FromFile'; do
  grep -q "$sym" <<<"$exported" || fail "$sym not exported"
done
foreign=$(grep -v -E '^ *(downpour::|typeinfo for downpour::|typeinfo name for downpour::|vtable for downpour::)' <<<"$exported" || true)
if [[ -n "$foreign" ]]; then
  fail "symbols outside namespace downpour exported: $(head -5 <<<"$foreign")"
fi

# Build outside the workspace: copy the example somewhere else first.
src="$tmp/example"
mkdir -p "$src"
cp "$root/sdk/example/main.cc" "$root/sdk/example/CMakeLists.txt" "$src/"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
pkg-config --exists downpour || fail "pkg-config does not find downpour"
# shellcheck disable=SC2046
g++ -std=c++17 -o "$tmp/example_gxx" "$src/main.cc" \
    $(pkg-config --cflags --libs downpour)
cmake -S "$src" -B "$tmp/cmake-build" -DCMAKE_BUILD_TYPE=Release >"$tmp/cmake.log" 2>&1 \
  || { cat "$tmp/cmake.log"; fail "cmake configure"; }
cmake --build "$tmp/cmake-build" >>"$tmp/cmake.log" 2>&1 \
  || { cat "$tmp/cmake.log"; fail "cmake build"; }
for exe in "$tmp/example_gxx" "$tmp/cmake-build/sdk_example"; do
  # Not `ldd | grep -q`: grep -q stops reading at the first match, ldd may
  # then die of SIGPIPE, and pipefail turns that into a failure.
  libs=$(LD_LIBRARY_PATH="$prefix/lib" ldd "$exe") || fail "ldd $exe"
  grep -qF "$prefix/lib/libdownpour.so.0" <<<"$libs" \
    || { echo "$libs" >&2; fail "$exe does not load the installed libdownpour.so.0"; }
done

# A scheduler and a server on free ports.
"$root/scheduler/ps_scheduler" --listen=127.0.0.1:0 --consistency=bsp --num_workers=2 \
    --address_file="$tmp/scheduler.address" >"$tmp/scheduler.log" 2>&1 &
scheduler_pid=$!
server_pid=""
cleanup() {
  [[ -n "$server_pid" ]] && kill -9 "$server_pid" 2>/dev/null || true
  kill -9 "$scheduler_pid" 2>/dev/null || true
}
trap cleanup EXIT
for _ in $(seq 300); do
  [[ -s "$tmp/scheduler.address" ]] && break
  sleep 0.1
done
[[ -s "$tmp/scheduler.address" ]] || { cat "$tmp/scheduler.log"; fail "no scheduler address"; }
address=$(head -1 "$tmp/scheduler.address")
"$root/server/ps_server" --scheduler="$address" --name=server-0 \
    >"$tmp/server.log" 2>&1 &
server_pid=$!

# Under --config=asan the library needs AddressSanitizer's runtime loaded
# first, and the examples are not built with it: preload it when they run.
asan=$(awk '/libasan\.so/ && $2 == "=>" {print $3; exit}' \
           <<<"$(ldd "$prefix/lib/libdownpour.so.0")")
preload="$asan${LD_PRELOAD:+:$LD_PRELOAD}"
[[ -n "$asan" ]] && echo "ASan build: running the examples with $asan preloaded"

run() {
  local exe=$1 table=$2 out
  out=$(LD_PRELOAD="$preload" LD_LIBRARY_PATH="$prefix/lib" timeout 60 "$exe" "$address" "$table") \
    || { cat "$tmp/server.log"; fail "$exe exited $?: $out"; }
  [[ "$out" == "ok 0" ]] || fail "$exe printed '$out', want 'ok 0'"
  echo "$exe: $out"
}
run "$tmp/example_gxx" gxx
run "$tmp/cmake-build/sdk_example" cmake

kill -TERM "$server_pid"; wait "$server_pid" || fail "ps_server exited $? on SIGTERM"
server_pid=""
kill -TERM "$scheduler_pid"; wait "$scheduler_pid" || fail "ps_scheduler exited $? on SIGTERM"
trap - EXIT
echo "PASS"
