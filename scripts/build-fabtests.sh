#!/usr/bin/env bash
# Builds libfabric's fabtests from a libfabric source tree you point it
# to (of the installed libfabric's version: Debian's libfabric-dev 1.17 ->
# `git archive v1.17.0` of ofiwg/libfabric), against the installed
# libfabric, into PREFIX/bin. Nothing of libfabric is kept in this repo.
#
# Usage: scripts/build-fabtests.sh LIBFABRIC_SRC [PREFIX]
#   LIBFABRIC_SRC  a libfabric source tree (with fabtests/), or fabtests/
#   PREFIX         where to install (default: /tmp/fabtests)
# Needs: libfabric-dev, autoconf, automake, libtool, make, a C compiler.
set -euo pipefail

src="${1:?usage: scripts/build-fabtests.sh LIBFABRIC_SRC [PREFIX]}"
prefix="${2:-/tmp/fabtests}"
[ -d "$src/fabtests" ] && src="$src/fabtests"
if [ ! -f "$src/configure.ac" ]; then
  echo "build-fabtests: $src has no fabtests (configure.ac)" >&2
  exit 2
fi
build="$(mktemp -d)"
trap 'rm -rf "$build"' EXIT
cp -a "$src/." "$build/"
cd "$build"
./autogen.sh >/dev/null
./configure --prefix="$prefix" --with-libfabric=/usr >/dev/null
make -j2 >/dev/null
make install >/dev/null
echo "build-fabtests: installed in $prefix/bin:"
ls "$prefix/bin" | grep -E '^fi_(rdm_tagged_pingpong|rdm_tagged_bw|rma_bw|rdm_atomic)$'
