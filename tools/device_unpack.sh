# Sourced on a lent machine after tools/device_pack.sh's archive came along
# (`carry` [".device"]): unpacks it into /tmp/d, sets BIN (a --bin_dir for
# bench/plan_check.py and ps_demo) and LD_LIBRARY_PATH (the carried Debian
# libraries, then the machine's own cuBLAS and CUDA runtime), and installs
# the Fashion-MNIST files where ps_demo and ps_worker read them when that
# folder is absent (never over a machine's own copy).
#
#   source tools/device_unpack.sh && "$BIN/tools/ps_demo" --workers=8
mkdir -p /tmp/d && tar -xJf .device/dev.tar.xz -C /tmp/d || return 3
if [[ ! -d /usr/share/datasets/fashion-mnist ]]; then
  mkdir -p /usr/share/datasets/fashion-mnist
  cp /tmp/d/data/* /usr/share/datasets/fashion-mnist/
fi
_cuda=""
for _n in libcublas.so.13 libcublasLt.so.13 libcudart.so.13; do
  _p=$(find /usr /opt -name "$_n" 2>/dev/null | head -1)
  [[ -n "$_p" ]] && _cuda="$_cuda:$(dirname "$_p")"
done
export LD_LIBRARY_PATH="/tmp/d/lib$_cuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export BIN=/tmp/d/bin PYTHONUNBUFFERED=1
unset _cuda _n _p
for _b in "$BIN"/*/*; do
  if ldd "$_b" | grep -q "not found"; then
    echo "device_unpack: $_b misses libraries:" >&2
    ldd "$_b" | grep "not found" >&2
  fi
done
unset _b
