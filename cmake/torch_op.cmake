# libattn_ladder_torch: the PyTorch operators registered from C++ (ladder/torch_op.cpp), built
# when the Python that CMake finds (Python3_EXECUTABLE; under `pip install` the build's own)
# imports torch. Without it the package defines the same operators in Python over the ctypes
# binding (python/attn_ladder/ops.py): everything works, at a higher host cost per call.
#
# torch's own CMake package (find_package(Torch)) is not used: it drags in its CUDA, cuDNN and
# MKL detection; this library needs only torch's headers, three of its libraries and its C++
# ABI flag, which torch itself reports. The library is tied to that exact torch build: its
# version goes into libattn_ladder_torch.version beside it, and ops.py loads the library only
# into the same torch.version (an ABI mismatch would crash rather than fail).
find_package(Python3 COMPONENTS Interpreter QUIET)
if(NOT Python3_Interpreter_FOUND)
  message(STATUS "attn_ladder: no Python 3 found: the PyTorch operator stays in Python (ctypes)")
  return()
endif()
execute_process(
  COMMAND "${Python3_EXECUTABLE}" -c
          "import os, torch; r = os.path.dirname(torch.__file__); print(torch.__version__); print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(r)"
  OUTPUT_VARIABLE attn_torch_out
  RESULT_VARIABLE attn_torch_rc
  ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT attn_torch_rc EQUAL 0)
  message(STATUS "attn_ladder: ${Python3_EXECUTABLE} has no torch: the PyTorch operator stays in Python (ctypes); "
                 "with torch there (pip: --no-build-isolation) it is built in C++")
  return()
endif()
string(REPLACE "\n" ";" attn_torch_out "${attn_torch_out}")
list(GET attn_torch_out 0 ATTN_TORCH_VERSION)
list(GET attn_torch_out 1 attn_torch_cxx11_abi)
list(GET attn_torch_out 2 attn_torch_root)
message(STATUS "attn_ladder: the PyTorch operator in C++ against torch ${ATTN_TORCH_VERSION} (${attn_torch_root})")

add_library(attn_ladder_torch SHARED ladder/torch_op.cpp)
target_include_directories(attn_ladder_torch SYSTEM PRIVATE "${attn_torch_root}/include"
                           "${attn_torch_root}/include/torch/csrc/api/include")
target_compile_definitions(attn_ladder_torch PRIVATE _GLIBCXX_USE_CXX11_ABI=${attn_torch_cxx11_abi})
# attn_ladder brings the C API (ladder/c_api.h) and the CUDA headers (c10/cuda's stream).
target_link_libraries(attn_ladder_torch PRIVATE attn_ladder "${attn_torch_root}/lib/libc10.so"
                      "${attn_torch_root}/lib/libc10_cuda.so" "${attn_torch_root}/lib/libtorch_cpu.so")
# Installed (pip), it finds libattn_ladder.so beside it; torch's libraries are already loaded
# by `import torch` when ops.py loads it.
set_target_properties(attn_ladder_torch PROPERTIES INSTALL_RPATH "$ORIGIN")
file(WRITE "${CMAKE_CURRENT_BINARY_DIR}/libattn_ladder_torch.version" "${ATTN_TORCH_VERSION}\n")
if(SKBUILD)
  install(TARGETS attn_ladder_torch LIBRARY DESTINATION attn_ladder)
  install(FILES "${CMAKE_CURRENT_BINARY_DIR}/libattn_ladder_torch.version" DESTINATION attn_ladder)
endif()
