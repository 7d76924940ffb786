#!/usr/bin/env bash
# Installs (or reports) what the build and the tests need besides the CUDA toolkit:
# CMake >= 3.25, Ninja, GoogleTest, Python 3 with matplotlib and pytest, cuobjdump. Uses apt and
# pip only.
#
#   scripts/install_deps.sh [--cmake4]
#
#   --cmake4  also the newest CMake from PyPI, in a virtual environment at .deps/cmake4
#             (.deps/cmake4/bin/cmake): CI checks the tests' registration with it as well as
#             with the system's CMake (.ci/run)
set -euo pipefail

want_cmake4=0
case ${1:-} in
  --cmake4) want_cmake4=1 ;;
  "") ;;
  *) echo "install_deps: unknown argument '$1' (--cmake4 or nothing)" >&2; exit 1 ;;
esac

need_apt=()
command -v ninja >/dev/null || need_apt+=(ninja-build)
command -v cmake >/dev/null || need_apt+=(cmake)
[ -f /usr/include/gtest/gtest.h ] || [ -f /usr/local/include/gtest/gtest.h ] || need_apt+=(libgtest-dev)
command -v python3 >/dev/null || need_apt+=(python3 python3-pip)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "install_deps: installing ${need_apt[*]} with apt-get"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

if ! python3 -c "import matplotlib" 2>/dev/null; then
  echo "install_deps: installing matplotlib with pip"
  python3 -m pip install --quiet matplotlib || python3 -m pip install --quiet --break-system-packages matplotlib
fi

if ! python3 -c "import pytest" 2>/dev/null; then
  echo "install_deps: installing pytest with pip"
  python3 -m pip install --quiet pytest || python3 -m pip install --quiet --break-system-packages pytest
fi

# cuobjdump (with nvdisasm, which it runs) reads the SASS for the sass_order test; some toolkit
# installs leave them out. The wheels' copies are found by scripts/sass_order.py (a failed
# install only skips that test).
if ! command -v cuobjdump >/dev/null && [ ! -x /usr/local/cuda/bin/cuobjdump ] &&
   ! python3 -c "import nvidia, os, sys; sys.exit(not any(os.path.isfile(os.path.join(p, 'cu13/bin/nvdisasm')) for p in nvidia.__path__))" 2>/dev/null; then
  echo "install_deps: installing cuobjdump and nvdisasm (nvidia-cuda-cuobjdump, -nvdisasm) with pip"
  wheels=(nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)
  python3 -m pip install --quiet "${wheels[@]}" || python3 -m pip install --quiet --break-system-packages "${wheels[@]}" ||
    echo "install_deps: could not install cuobjdump; the sass_order test will skip"
fi

command -v nvcc >/dev/null || { echo "install_deps: nvcc not found: install the CUDA toolkit (>= 12.4) and put its bin/ on PATH" >&2; exit 1; }
cmake_version=$(cmake --version | head -1 | awk '{print $3}')
if [ "$(printf '%s\n' 3.25 "$cmake_version" | sort -V | head -1)" != 3.25 ]; then
  echo "install_deps: CMake $cmake_version is older than 3.25 (python3 -m pip install cmake gives a newer one)" >&2
  exit 1
fi

if [ $want_cmake4 -eq 1 ]; then
  deps=$(cd "$(dirname "$0")/.." && pwd)/.deps
  if [ ! -x "$deps/cmake4/bin/cmake" ]; then
    echo "install_deps: installing the newest CMake from PyPI into $deps/cmake4"
    mkdir -p "$deps"
    if python3 -m venv "$deps/cmake4" 2>/dev/null; then
      "$deps/cmake4/bin/pip" install --quiet cmake
    else  # no ensurepip (Debian without python3-venv): the wheel's files, its bin/ linked
      rm -rf "$deps/cmake4"
      python3 -m pip install --quiet --target "$deps/cmake4/site" cmake
      ln -s site/cmake/data/bin "$deps/cmake4/bin"
    fi
  fi
  echo "install_deps: $("$deps/cmake4/bin/cmake" --version | head -1) at $deps/cmake4/bin"
fi
echo "install_deps: ok (cmake $cmake_version, $(nvcc --version | tail -1))"
