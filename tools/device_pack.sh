#!/usr/bin/env bash
# Packs what a lent machine needs to run the daemons, ps_demo, psctl and the
# Python-free benchmarks (bench/plan_check.py, ps_bench, elastic_bench,
# embedding_bench): the `-c opt` binaries, stripped, with the Debian
# libraries they load (not glibc's, not CUDA's: the lent machines have
# their own) and the Fashion-MNIST files, in .device/dev.tar.xz (about
# 40 MiB; .device/ is ignored by git and travels with `carry`).
#
#   bash tools/device_pack.sh
#   device run, carry [".device"]:
#     source tools/device_unpack.sh && python3 bench/plan_check.py --bin_dir=$BIN ...
set -euo pipefail
cd "$(dirname "$0")/.."

bins=(tools/ps_demo worker/ps_worker server/ps_server scheduler/ps_scheduler
      psctl/psctl bench/ps_bench bench/elastic_bench bench/embedding_bench)
targets=()
for b in "${bins[@]}"; do targets+=("//${b%/*}:${b##*/}"); done
bazel build -c opt "${targets[@]}"

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
# Uncompressed (xz packs them better than their gzip); zlib's gzopen reads
# a plain file under a .gz name as it is.
for f in /usr/share/datasets/fashion-mnist/*.gz; do
  gunzip -c "$f" > "$stage/data/$(basename "$f")"
done
mkdir -p .device
echo "device_pack: compressing (about a minute)"
tar -cJf .device/dev.tar.xz -C "$stage" bin lib data
ls -l .device/dev.tar.xz
