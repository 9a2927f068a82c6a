#!/usr/bin/env bash
# Builds llama.cpp from the package registry for the optional `llamacpp` backend and scripts/bench_peer.py:
# the llama-cpp-python sdist vendors llama.cpp, so one CMake build tree gives both the Python binding (pip) and
# the tools (llama-quantize, llama-batched-bench, llama-server) compiled from the very same source and flags.
# Never part of the default set-up: `pip install autotune[llamacpp]` gets a generic wheel build; this script is what
# gives the tools and a -march=native build. Usage: scripts/build_llamacpp.sh [VERSION]  (PYTHON=... to choose pip)
set -euo pipefail

VERSION="${1:-0.3.36}"
PYTHON="${PYTHON:-python}"
JOBS="${JOBS:-2}"
ROOT="${AUTOTUNE_CACHE:-$HOME/.cache/autotune}/llamacpp/$VERSION"
# GGML_NATIVE: the kernels this CPU has (AVX-512, VNNI, BF16), as a deployment on it would build them.
# LLAVA_BUILD=OFF: no multimodal library, which a text model never loads and which costs build minutes.
FLAGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF -DCMAKE_BUILD_TYPE=Release"
# NO_AMX=1: this CPU's instructions but AMX's, named one by one (-march=native would enable the AMX tile kernels).
# Where a KVM guest reports AMX but its tile configuration faults (ldtilecfg: SIGSEGV, seen on a 2-core Xeon guest
# reporting family 6 model 167), every quantized matmul of llama.cpp would crash.
if [ "${NO_AMX:-0}" = 1 ]; then
    FLAGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DCMAKE_BUILD_TYPE=Release"
    has() { grep -qw "$1" /proc/cpuinfo; }
    for pair in avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 avx512f:AVX512 avx512vbmi:AVX512_VBMI \
                avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16 avx_vnni:AVX_VNNI; do
        has "${pair%%:*}" && FLAGS="$FLAGS -DGGML_${pair##*:}=ON"
    done
fi
mkdir -p "$ROOT/src" "$ROOT/bin"
start=$(date +%s)

if [ ! -d "$ROOT/src/llama_cpp_python-$VERSION" ]; then
    "$PYTHON" -m pip download --no-binary :all: --no-deps "llama-cpp-python==$VERSION" -d "$ROOT/src"
    tar xzf "$ROOT/src/llama_cpp_python-$VERSION.tar.gz" -C "$ROOT/src"
fi
SRC="$ROOT/src/llama_cpp_python-$VERSION"

# --no-deps: its dependencies (numpy, jinja2, diskcache, typing-extensions) are never upgraded in a shared env; the one
# that is often missing, diskcache (pure Python, no dependencies of its own), is installed apart.
"$PYTHON" -c "import diskcache" 2>/dev/null || "$PYTHON" -m pip install --no-deps "diskcache>=5.6.1"
# Skipped where this version is installed from this build tree already (FORCE=1 rebuilds).
if [ "${FORCE:-0}" = 1 ] || [ "$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))' \
        2>/dev/null)" != "$VERSION" ] || [ ! -d "$ROOT/build" ]; then
    CMAKE_ARGS="$FLAGS" CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" MAKEFLAGS="-j$JOBS" \
        "$PYTHON" -m pip install --no-deps -v "$SRC" --config-settings=build-dir="$ROOT/build"
    pip_seconds=$(( $(date +%s) - start ))
else
    pip_seconds="skipped: llama-cpp-python $VERSION is installed from $ROOT/build"
fi
tools_start=$(date +%s)

# The same tree again, now with the tools: ggml and llama objects are already built, so only the tools compile.
cmake -S "$SRC" -B "$ROOT/build" -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON $FLAGS
cmake --build "$ROOT/build" --target llama-quantize llama-batched-bench llama-server -j "$JOBS"
for tool in llama-quantize llama-batched-bench llama-server; do
    cp "$(find "$ROOT/build" -type f -name "$tool" -perm -u+x | head -1)" "$ROOT/bin/"
done
# The tools link the shared libraries; keep them beside the binaries so the folder stands alone.
find "$ROOT/build" -name 'lib*.so*' -exec cp -P {} "$ROOT/bin/" \;

vendored=$(grep -o -m1 'ggml-org/llama.cpp@[0-9a-f]*' "$SRC/CHANGELOG.md" || echo unknown)
{
    echo "llama_cpp_python: $VERSION"
    echo "llama_cpp: $vendored"
    echo "cmake_flags: $FLAGS"
    echo "compiler: $(${CXX:-g++} --version | head -1)"
    echo "jobs: $JOBS"
    echo "pip_build_seconds: $pip_seconds"
    echo "tools_build_seconds: $(( $(date +%s) - tools_start ))"
} > "$ROOT/BUILD_INFO"
cat "$ROOT/BUILD_INFO"
