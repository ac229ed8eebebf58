#!/usr/bin/env bash
# Installs every dependency (Debian 12) and builds Release into build/. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(build-essential cmake ninja-build pkg-config git
      libgtest-dev libgmock-dev libbenchmark-dev
      nlohmann-json3-dev libpcre2-dev libcli11-dev libspdlog-dev libfmt-dev
      libboost-dev libboost-system-dev
      flatbuffers-compiler libflatbuffers-dev
      libopenblas-dev libomp-dev
      libopenmpi-dev openmpi-bin  # tensor parallelism over MPI (serve --tp N under mpirun; tests: test_mpi)
      clang libclang-rt-dev  # scripts/fuzz.sh: libFuzzer (clang's runtime)
      python3                # tests/soak
      python3-jinja2)        # test only: the oracle of the Jinja chat-template interpreter (tests/unit/test_jinja.cpp)
# Node.js/npm (for the server's tests with real clients): use the machine's own when there is one
# (Debian's npm conflicts with NodeSource's nodejs). Debian 12's node 18 runs the openai and Vercel
# AI SDK tests; LangChain JS and LlamaIndex need node >= 20 and their tests skip, saying so.
command -v npm >/dev/null 2>&1 || PKGS+=(nodejs npm)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# The npm clients of the server's end-to-end tests (tests/e2e/node: openai, LangChain JS, the
# Vercel AI SDK, LlamaIndex), pinned by its package-lock.json; re-installed only when absent or
# older than the lock file.
if command -v npm >/dev/null 2>&1; then
  NODE_DIR=tests/e2e/node
  if [ ! -d "$NODE_DIR/node_modules/openai" ] ||
     [ "$NODE_DIR/package-lock.json" -nt "$NODE_DIR/node_modules/.package-lock.json" ]; then
    (cd "$NODE_DIR" && npm ci --no-audit --no-fund)
  fi
fi

BUILD_TYPE=${BUILD_TYPE:-Release}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE="$BUILD_TYPE"
cmake --build build -j"$(nproc)"
