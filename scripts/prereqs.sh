#!/usr/bin/env bash
# Sourced by the build scripts: checks the system tools a build needs before cargo starts, so
# a missing one is one clear line instead of a failure deep in a dependency's build script.

# need_rdma_build_tools WHAT: the `rdma` feature (and the Python wheel, built with it) compiles
# sideway's rdma-core loader, which needs cmake and libclang.
need_rdma_build_tools() {
  local missing=()
  command -v cmake >/dev/null 2>&1 || missing+=(cmake)
  if [ -z "${LIBCLANG_PATH:-}" ] && ! ls /usr/lib/llvm-*/lib/libclang.so* /usr/lib/*/libclang*.so* >/dev/null 2>&1; then
    missing+=(libclang-dev)
  fi
  if [ ${#missing[@]} -gt 0 ]; then
    echo "building $1 needs ${missing[*]}: install with 'sudo apt-get install ${missing[*]}' (or your system's packages), then run this again" >&2
    exit 1
  fi
}

# need_etcd_build_tools WHAT: the `etcd` feature builds etcd-client's protocol code with protoc
# and the well-known .proto files (Debian: protobuf-compiler and libprotobuf-dev).
need_etcd_build_tools() {
  local missing=()
  command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
  [ -e /usr/include/google/protobuf/descriptor.proto ] || [ -n "${PROTOC_INCLUDE:-}" ] || missing+=(libprotobuf-dev)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "building $1 needs ${missing[*]}: install with 'sudo apt-get install ${missing[*]}', then run this again" >&2
    exit 1
  fi
}
