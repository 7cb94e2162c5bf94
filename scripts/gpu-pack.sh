#!/usr/bin/env bash
# gpu-pack.sh BUILD OUT.tar.xz — a CUDA build packed for the GPU lease machine,
# which has no package registry and lacks some of the libraries dsv4 links
# (libpcre2, libmicrohttpd and its TLS chain, libcjson). BUILD is configured
# with -DDSV4_CUDA=ON -DDSV4_CUDA_SHARED=ON -DDSV4_MPI=OFF (one libdsv4cuda.so
# instead of the device code in every binary: ~12 MB of xz for the five GPU
# binaries instead of ~49 MB, inside the 64 MiB that travels there). The
# archive holds b/ with dsv4, the GPU suite's tests and b/lib/ (every shared
# library they need outside glibc and the driver); there:
#   tar -xJf OUT.tar.xz -C /tmp && DSV4_CUDA_BUILD=/tmp/b scripts/gpu-test.sh
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: gpu-pack.sh BUILD OUT.tar.xz" >&2; exit 2; }
B=$1 OUT=$2
[ -f "$B/libdsv4cuda.so" ] || { echo "gpu-pack: $B/libdsv4cuda.so missing (configure with -DDSV4_CUDA_SHARED=ON)" >&2; exit 1; }
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
mkdir -p "$W/b/lib"
for f in dsv4 test_cuda_ops test_kernels test_reference test_batch test_intermediates test_long test_mtp; do
  [ -x "$B/$f" ] || { echo "gpu-pack: $B/$f missing (build it first)" >&2; exit 1; }
  cp "$B/$f" "$W/b/"
done
cp "$B/libdsv4cuda.so" "$W/b/lib/"
# the libraries they load, outside glibc, the C++ runtime and the driver
for f in "$W"/b/* "$W/b/lib/libdsv4cuda.so"; do
  [ -f "$f" ] || continue
  ldd "$f" | awk '$3 ~ /^\// {print $3}'
done | sort -u | grep -v -E '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libstdc\+\+|libgcc_s|libcuda)\.so' |
  while read -r l; do cp -L "$l" "$W/b/lib/"; done
strip "$W"/b/dsv4 "$W"/b/test_* "$W/b/lib/libdsv4cuda.so" 2>/dev/null || true
XZ_OPT=-9 tar -C "$W" -cJf "$OUT" b # -9: a dictionary that spans the binaries (each holds the CPU code)
echo "gpu-pack: $OUT ($(du -h "$OUT" | cut -f1)): $(ls "$W/b" | grep -v lib | tr '\n' ' ')+ $(ls "$W/b/lib" | wc -l) libraries"
