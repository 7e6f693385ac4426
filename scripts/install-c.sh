#!/bin/bash
# Installs gdasync's C library into PREFIX without cargo: lib/libgdasync.so.0 (+ libgdasync.so),
# lib/libgdasync.a, include/gdasync.h (and mp.h where built), include/gdsync.cuh (with
# gdsync_format.h, for CUDA kernels), lib/pkgconfig/gdasync.pc and lib/cmake/gdasync/
# (find_package). Build the library first, once:
#
#   cargo build --release -p gdasync-c
#   scripts/install-c.sh /usr/local                 # or any prefix; DESTDIR is honoured
#
# --lib-dir DIR takes the built libraries from DIR (default: the release folder of the target
# directory, ./target/release or $CARGO_TARGET_DIR/release, or its deps/ folder, where a
# `cargo test` build leaves them).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
usage() { echo "usage: $0 [--lib-dir DIR] PREFIX" >&2; exit 2; }
lib_dir=""
prefix=""
while [ $# -gt 0 ]; do
  case "$1" in
    --lib-dir) [ $# -ge 2 ] || usage; lib_dir=$2; shift 2;;
    -h|--help) usage;;
    -*) usage;;
    *) [ -z "$prefix" ] || usage; prefix=$1; shift;;
  esac
done
[ -n "$prefix" ] || usage
case "$prefix" in /*) ;; *) prefix="$(pwd)/$prefix";; esac

if [ -z "$lib_dir" ]; then
  target=${CARGO_TARGET_DIR:-$here/target}
  for d in "$target/release" "$target/release/deps"; do
    if [ -f "$d/libgdasync_c.so" ] && [ -f "$d/libgdasync_c.a" ]; then lib_dir=$d; break; fi
  done
  [ -n "$lib_dir" ] || { echo "$0: no libgdasync_c.so and libgdasync_c.a under $target/release: run 'cargo build --release -p gdasync-c' first, or name the folder with --lib-dir" >&2; exit 1; }
fi
for f in libgdasync_c.so libgdasync_c.a; do
  [ -f "$lib_dir/$f" ] || { echo "$0: $lib_dir/$f is missing: run 'cargo build --release -p gdasync-c' first" >&2; exit 1; }
done

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' "$here/Cargo.toml")
major=${version%%.*}; rest=${version#*.}; minor=${rest%%.*}
# The system libraries a program linking the static library needs (rustc --print native-static-libs).
private_libs="-ldl -lgcc_s -lutil -lrt -lpthread -lm -lc"
dest="${DESTDIR:-}$prefix"

install -d "$dest/lib/pkgconfig" "$dest/lib/cmake/gdasync" "$dest/include"
install -m 0755 "$lib_dir/libgdasync_c.so" "$dest/lib/libgdasync.so.$version"
ln -sf "libgdasync.so.$version" "$dest/lib/libgdasync.so.$major"
ln -sf "libgdasync.so.$major" "$dest/lib/libgdasync.so"
install -m 0644 "$lib_dir/libgdasync_c.a" "$dest/lib/libgdasync.a"
for h in "$here"/capi/include/*.h; do install -m 0644 "$h" "$dest/include/"; done
# The CUDA device header (and the formats it includes): kernels compiled with nvcc or NVRTC
# drive QPs handed over by gdasync_qp_to_kernel with it.
install -m 0644 "$here/gdsync/include/gdsync.cuh" "$here/gdsync/include/gdsync_format.h" "$dest/include/"
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" -e "s|@PRIVATE_LIBS@|$private_libs|" \
  "$here/capi/gdasync.pc.in" > "$dest/lib/pkgconfig/gdasync.pc"
install -m 0644 "$here/capi/cmake/gdasyncConfig.cmake" "$dest/lib/cmake/gdasync/"
sed -e "s|@VERSION@|$version|g" -e "s|@MAJOR@|$major|g" -e "s|@MINOR@|$minor|g" \
  "$here/capi/cmake/gdasyncConfigVersion.cmake.in" > "$dest/lib/cmake/gdasync/gdasyncConfigVersion.cmake"
echo "installed gdasync $version into $dest (pkg-config: PKG_CONFIG_PATH=$prefix/lib/pkgconfig; CMake: -DCMAKE_PREFIX_PATH=$prefix)"
