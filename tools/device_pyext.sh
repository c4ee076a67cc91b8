#!/usr/bin/env bash
# Run on a lent machine after `source tools/device_unpack.sh`: compiles the
# Python extension's own sources (python/src) against this machine's Python
# and pybind11 and links them with the objects and libraries that
# tools/device_pack.sh carried, into python/downpour/_downpour.so, where
# `import downpour` with python/ on the path finds it (under a minute).
#
#   source tools/device_unpack.sh && bash tools/device_pyext.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ext=/tmp/d/pyext
[[ -d "$ext/objs" ]] || { echo "device_pyext: $ext missing; run tools/device_pack.sh here first" >&2; exit 2; }
if python3 -m pybind11 --includes > /dev/null 2>&1; then
  py_includes=$(python3 -m pybind11 --includes)
else
  # No pybind11 module (Debian's pybind11-dev): its headers under /usr/include.
  py_includes="-I$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
fi
export CXXFLAGS_PYEXT="-O2 -DNDEBUG -std=c++17 -fPIC -fvisibility=hidden -I. -I$ext/include $py_includes"
mkdir -p "$ext/build"
printf '%s\n' python/src/*.cc | xargs -P "$(nproc)" -I{} sh -c \
  'g++ $CXXFLAGS_PYEXT -c "$1" -o "'"$ext"'/build/$(basename "$1" .cc).o"' _ {}
libs=()
while read -r l; do libs+=("/tmp/d/lib/$l"); done < "$ext/libs.txt"
g++ -shared -o python/downpour/_downpour.so "$ext"/build/*.o "$ext"/objs/*.o \
  "${libs[@]}" -Wl,--gc-sections -Wl,--version-script=python/src/extension.lds \
  -Wl,-rpath,/tmp/d/lib -lpthread
PYTHONPATH=python python3 -c 'import downpour, sys; print("device_pyext: downpour", downpour.__version__, "for Python", sys.version.split()[0])'
