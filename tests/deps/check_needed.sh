#!/bin/sh
# check_needed.sh — programs and libraries that must start on a machine without CUDA or
# NCCL: none of them has a NEEDED entry (readelf -d) naming the CUDA runtime (libcudart),
# the driver (libcuda) or NCCL (libnccl). libsyncbn links the CUDA runtime statically and
# loads NCCL at its first use.
#   check_needed.sh READELF FILE...
readelf=$1
shift
fail=0
for f in "$@"; do
  needed=$("$readelf" -d "$f") || { echo "check_needed: $readelf -d $f failed"; fail=1; continue; }
  bad=$(printf '%s\n' "$needed" | grep 'NEEDED' | grep -E '\[lib(cudart|cuda|nccl)\.so')
  if [ -n "$bad" ]; then
    echo "check_needed: $f needs:"
    printf '%s\n' "$bad"
    fail=1
  else
    echo "check_needed: $f: no libcudart, libcuda or libnccl"
  fi
done
exit $fail
