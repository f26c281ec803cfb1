#!/usr/bin/env bash
# Installs the llama.cpp extra (llama-cpp-python, pinned in pyproject.toml and constraints.txt) into
# the venv of scripts/bootstrap.sh. Sourced by scripts/test.sh after bootstrap.sh.
#
# pip compiles llama.cpp from source here (no wheel on PyPI for this platform): 15-35 min on 2
# cores. llama.cpp's default build (GGML_NATIVE) compiles for every instruction the build CPU
# reports, AMX included, and machines of this project report AMX tiles that their kernel does not
# let a process use: the first batched matrix product then dies with SIGILL (seen here: tileloadd in
# ggml_backend_amx_mul_mat). So it is built for the instruction set every machine of the project
# has (AVX2, FMA, F16C), once per CPU model and set-up, into ~/.cache/ragspec/wheels (pip's own wheel
# cache does not know about build flags, so it is bypassed for this one package).
set -euo pipefail
LLAMA_VERSION="$(sed -n 's/^llama[-_]cpp[-_]python==//Ip' "$ROOT/constraints.txt")"
FLAGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
KEY="$(printf '%s\n%s\n%s\n' "$LLAMA_VERSION" "$FLAGS" "$(grep -m1 '^model name' /proc/cpuinfo)" | sha256sum | cut -c1-16)"
WHEELS="${RAGSPEC_CACHE_DIR:-$HOME/.cache/ragspec}/wheels/llama-cpp-$KEY"
if [[ "$(cat "$VENV/.ragspec-llamacpp" 2>/dev/null)" != "$WANT-$KEY" ]]; then
    if ! ls "$WHEELS"/llama_cpp_python-"$LLAMA_VERSION"-*.whl >/dev/null 2>&1; then
        echo "[setup] compiling llama.cpp $LLAMA_VERSION for AVX2 (first run only, 15-35 min on 2 cores)" >&2
        mkdir -p "$WHEELS.tmp"
        CMAKE_ARGS="$FLAGS" python -m pip wheel -q --no-deps --no-cache-dir -w "$WHEELS.tmp" "llama-cpp-python==$LLAMA_VERSION"
        rm -rf "$WHEELS" && mv "$WHEELS.tmp" "$WHEELS"  # published whole: an interrupted build leaves no wheel
    fi
    echo "[setup] installing the llama.cpp extra" >&2
    python -m pip install -q --force-reinstall --no-deps "$WHEELS"/llama_cpp_python-"$LLAMA_VERSION"-*.whl
    python -m pip install -q -c "$ROOT/constraints.txt" --find-links "$WHEELS" -e "$ROOT[all,test,llamacpp]"
    echo "$WANT-$KEY" > "$VENV/.ragspec-llamacpp"
fi
