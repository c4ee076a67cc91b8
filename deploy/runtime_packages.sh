#!/usr/bin/env bash
# Prints the Debian packages that hold the shared libraries the given
# binaries load (as ldd resolves them on this machine), one per line, sorted:
# what a runtime image needs installed to run them.
#
#   bash deploy/runtime_packages.sh [--foreign=FILE] BINARY...
#
# A library no Debian package holds (e.g. CUDA's, from NVIDIA's installer)
# is an error, unless --foreign names a file to list such libraries in (one
# path a line), for the image to carry them itself.
set -euo pipefail
foreign=""
if [[ "${1:-}" == --foreign=* ]]; then foreign=${1#--foreign=}; shift; : > "$foreign"; fi
(($#)) || { echo "usage: $0 [--foreign=FILE] BINARY..." >&2; exit 2; }
mapfile -t libs < <(ldd "$@" | awk '$2 == "=>" && $3 ~ /^\// {print $3}
                                    $1 ~ /^\// && $1 !~ /:$/ {print $1}' | sort -u)
# dpkg knows a file under the path its package installed it at: with Debian
# 12's merged /usr that may be /lib/... or /usr/lib/... One dpkg call for all.
candidates() { printf '%s\n' "$1" "$(readlink -f "$1")" "${1#/usr}" "/usr$1"; }
declare -A owner
while IFS= read -r line; do
  path=${line##*: }
  pkg=${line%%: *}
  owner[$path]=${pkg%%[:,]*}
done < <(for lib in "${libs[@]}"; do candidates "$lib"; done | sort -u |
         xargs dpkg -S 2>/dev/null || true)
for lib in "${libs[@]}"; do
  pkg=""
  while IFS= read -r p; do
    if [[ -n ${owner[$p]:-} ]]; then pkg=${owner[$p]}; break; fi
  done < <(candidates "$lib")
  if [[ -n $pkg ]]; then
    echo "$pkg"
  elif [[ -n $foreign ]]; then
    echo "$lib" >> "$foreign"
  else
    echo "runtime_packages: no Debian package holds $lib" >&2
    exit 1
  fi
done | sort -u
