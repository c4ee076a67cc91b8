#!/usr/bin/env bash
# Packs what a lent machine needs to run the daemons, ps_demo, psctl and the
# benchmarks (bench/plan_check.py, ps_bench, elastic_bench, embedding_bench,
# and with the Python SDK bench/dlrm_bench.py): the `-c opt` binaries,
# stripped, with the Debian libraries they load (not glibc's, not CUDA's:
# the lent machines have their own) and the Fashion-MNIST files, in
# .device/dev.tar.xz (about 45 MiB; .device/ is ignored by git and travels
# with `carry`).
#
# The Python extension cannot travel built: a lent machine has its own
# Python (3.12 where Debian 12 has 3.11) and NumPy 2, which needs pybind11
# 2.12 or later (Debian's is 2.10). So the objects it links travel compiled,
# with every header python/src includes beyond Python's, pybind11's and the
# C library's, and tools/device_pyext.sh compiles python/src there against
# that machine's Python and pybind11 and links the two.
#
#   bash tools/device_pack.sh
#   device run, carry [".device"]:
#     source tools/device_unpack.sh && python3 bench/plan_check.py --bin_dir=$BIN ...
#     source tools/device_unpack.sh && bash tools/device_pyext.sh && python3 bench/dlrm_bench.py --bin_dir=$BIN ...
set -euo pipefail
cd "$(dirname "$0")/.."

bins=(tools/ps_demo worker/ps_worker server/ps_server scheduler/ps_scheduler
      psctl/psctl bench/ps_bench bench/elastic_bench bench/embedding_bench)
targets=()
for b in "${bins[@]}"; do targets+=("//${b%/*}:${b##*/}"); done
bazel build -c opt "${targets[@]}" //python:downpour

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/data"
for b in "${bins[@]}"; do
  mkdir -p "$stage/bin/${b%/*}"
  cp "bazel-out/k8-opt/bin/$b" "$stage/bin/$b"
  chmod u+w "$stage/bin/$b"
  strip "$stage/bin/$b"
done
for b in "${bins[@]}"; do ldd "$stage/bin/$b"; done | awk '{print $3}' |
  grep -v -E '^$|/(libc|libm|libpthread|libdl|librt|libgcc_s|libstdc\+\+)\.so|ld-linux|cuda' |
  sort -u | while read -r lib; do cp -L "$lib" "$stage/lib/"; done

# The extension's objects, in link order, less its own (python/src).
mkdir -p "$stage/pyext/objs" "$stage/pyext/include"
link=$(bazel aquery -c opt 'mnemonic("CppLink", //python:downpour/_downpour.so)' \
  --output=text 2>/dev/null | sed -n '/Command Line/,/^$/p')
n=0
for o in $(grep -o "bazel-out/[^ ']*\.pic\.o" <<<"$link" | grep -v '^bazel-out/k8-opt/bin/python/'); do
  n=$((n + 1))
  to="$stage/pyext/objs/$(printf %03d $n)_$(basename "$o")"
  cp "$o" "$to"
  chmod u+w "$to"
  strip --strip-debug "$to"
done
# The shared libraries it names, by the file name the binaries load.
for l in $(grep -o -E -- "^ *-l[a-z0-9_+]+" <<<"$link" | sed 's/^ *-l//' | grep -v -x -E 'pthread|stdc\+\+|m|dl|rt'); do
  f=$(readlink -f "/usr/lib/x86_64-linux-gnu/lib$l.so")
  [[ -e "$stage/lib/$(basename "$f")" ]] || cp -L "$f" "$stage/lib/"
  basename "$f"
done > "$stage/pyext/libs.txt"
# The headers python/src reads beyond the tree's own (which travels), the C
# and C++ libraries', Python's and pybind11's: Abseil's and protobuf's from
# /usr/include, the generated ones from bazel-out.
for cc in python/src/*.cc; do
  gcc -M -std=c++17 -iquote . -iquote bazel-out/k8-opt/bin -isystem /usr/include/python3.11 \
    -isystem /usr/include/eigen3 "$cc"
done | tr ' \\' '\n\n' | grep -E '^(/usr/include/(absl|google)/|bazel-out/k8-opt/bin/).*\.(h|inc)$' |
  sort -u | while read -r h; do
    rel=${h#/usr/include/}
    rel=${rel#bazel-out/k8-opt/bin/}
    mkdir -p "$stage/pyext/include/$(dirname "$rel")"
    cp -L "$h" "$stage/pyext/include/$rel"
  done
# Uncompressed (xz packs them better than their gzip); zlib's gzopen reads
# a plain file under a .gz name as it is.
for f in /usr/share/datasets/fashion-mnist/*.gz; do
  gunzip -c "$f" > "$stage/data/$(basename "$f")"
done
mkdir -p .device
echo "device_pack: compressing (about a minute)"
tar -cJf .device/dev.tar.xz -C "$stage" bin lib data pyext
ls -l .device/dev.tar.xz
