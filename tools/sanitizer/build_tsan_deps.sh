#!/usr/bin/env bash
# Builds Abseil and Cap'n Proto/KJ with -fsanitize=thread, at the versions Debian bookworm ships
# (libabsl-dev 20220623.1, libcapnp-dev 0.9.2), as static PIC libraries into one prefix, so a TSAN
# build of refitd sees absl::Mutex, kj::Mutex and KJ's cross-thread executor (docs/reliability.md,
# "Sanitizers"). Not run in CI. Usage:
#
#   tools/sanitizer/build_tsan_deps.sh [PREFIX]          # default PREFIX: $HOME/tsan-deps
#   cmake -S . -B build-tsan -DREFIT_CUDA=OFF -DREFIT_SANITIZE=thread -DCMAKE_PREFIX_PATH=PREFIX
#
# Environment:
#   ABSL_GIT, CAPNP_GIT  git URL or local clone/mirror to fetch from (default: GitHub)
#   ABSL_TAG, CAPNP_TAG  tags (default 20220623.1, v0.9.2)
#   DEPS                 which to build: "absl capnp" (default), or one of them
#   JOBS                 parallel build jobs (default: nproc)
#   CXX                  compiler (default g++; use the same one as for refitd)
set -euo pipefail

PREFIX=$(realpath -m "${1:-$HOME/tsan-deps}")
ABSL_GIT=${ABSL_GIT:-https://github.com/abseil/abseil-cpp.git}
CAPNP_GIT=${CAPNP_GIT:-https://github.com/capnproto/capnproto.git}
ABSL_TAG=${ABSL_TAG:-20220623.1}
CAPNP_TAG=${CAPNP_TAG:-v0.9.2}
DEPS=${DEPS:-absl capnp}
JOBS=${JOBS:-$(nproc)}
export CXX=${CXX:-g++} CC=${CC:-gcc}
SRC=$PREFIX/src
BUILD=$PREFIX/build
mkdir -p "$SRC" "$BUILD"

# Same instrumentation as refitd's -DREFIT_SANITIZE=thread.
FLAGS="-fsanitize=thread -fno-omit-frame-pointer"
common=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX="$PREFIX"
  -DCMAKE_INSTALL_LIBDIR=lib -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DBUILD_SHARED_LIBS=OFF
  -DCMAKE_C_FLAGS="$FLAGS" -DCMAKE_CXX_FLAGS="$FLAGS"
  -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread)

checkout() {  # url tag dir
  if [[ -d $3/.git ]] && [[ $(git -C "$3" describe --tags --exact-match 2>/dev/null) == "$2" ]]; then
    return
  fi
  rm -rf "$3"
  git -c advice.detachedHead=false clone --quiet --depth 1 --branch "$2" "$1" "$3"
}

for dep in $DEPS; do
  case $dep in
    absl)
      checkout "$ABSL_GIT" "$ABSL_TAG" "$SRC/abseil-cpp"
      # C++20 like refitd, so the installed absl/base/options.h picks std::string_view,
      # std::optional etc. the same way refitd's translation units do.
      cmake -S "$SRC/abseil-cpp" -B "$BUILD/absl" "${common[@]}" -DCMAKE_CXX_STANDARD=20 \
        -DABSL_PROPAGATE_CXX_STD=ON -DBUILD_TESTING=OFF -DABSL_BUILD_TESTING=OFF
      cmake --build "$BUILD/absl" -j"$JOBS"
      cmake --install "$BUILD/absl" >/dev/null
      ;;
    capnp)
      checkout "$CAPNP_GIT" "$CAPNP_TAG" "$SRC/capnproto"
      # WITH_OPENSSL: refitd uses kj-tls. The capnp compiler tools are built too (refitd's
      # schemas are generated with them); they are instrumented, which only makes them slower.
      # KJ keeps its own language standard (it requires GNU extensions), as in Debian's build.
      cmake -S "$SRC/capnproto/c++" -B "$BUILD/capnp" "${common[@]}" -DBUILD_TESTING=OFF -DWITH_OPENSSL=ON
      cmake --build "$BUILD/capnp" -j"$JOBS"
      cmake --install "$BUILD/capnp" >/dev/null
      ;;
    *) echo "unknown dep: $dep" >&2; exit 2 ;;
  esac
done
echo "instrumented deps in $PREFIX: configure refitd with -DCMAKE_PREFIX_PATH=$PREFIX"
