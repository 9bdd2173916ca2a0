# Finds LibTorch (from the pinned PyPI wheel or any install) and defines the target fastlearn_torch: torch,
# c10d with Gloo, and NCCL when the LibTorch build has CUDA. The build and the installed package
# (fastlearnConfig.cmake, where it is fastlearn::torch) both use this file.

if(FASTLEARN_PYTHON)
  execute_process(
    COMMAND "${FASTLEARN_PYTHON}" -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE _torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc ERROR_QUIET)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "fastlearn: ${FASTLEARN_PYTHON} cannot import torch. Run scripts/bootstrap "
                        "(or `make deps`) to install the pinned LibTorch.")
  endif()
  list(PREPEND CMAKE_PREFIX_PATH "${_torch_prefix}")
endif()

# CMake 3.25 cannot probe nvcc for C++20; naming the architectures skips LibTorch's GPU probe.
# fastlearn has no .cu sources, so the list only matters to users who add their own.
if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(TORCH_CUDA_ARCH_LIST "8.0;9.0")
endif()

find_package(Torch QUIET)
if(NOT Torch_FOUND)
  message(FATAL_ERROR "fastlearn: LibTorch not found. Run scripts/bootstrap (or `make deps`), or pass "
                      "-DFASTLEARN_PYTHON=<python with torch> or -DCMAKE_PREFIX_PATH=<torch cmake prefix>.")
endif()
# 2.14.1 is the pin of scripts/bootstrap; 2.11 is what the GPU machine of scripts/device-check has (its build and
# CPU suite are checked against the 2.11.0 wheel). Older ones lack c10d APIs fastlearn uses (Backend::shutdown).
if(Torch_VERSION VERSION_LESS 2.11)
  message(FATAL_ERROR "fastlearn: LibTorch ${Torch_VERSION} is too old; fastlearn needs >= 2.11.")
endif()

find_path(FASTLEARN_GLOO_INCLUDE_DIR gloo/config.h)
if(NOT FASTLEARN_GLOO_INCLUDE_DIR)
  message(FATAL_ERROR "fastlearn: Gloo headers not found (the torch wheel ships none). "
                      "Install them with: apt-get install libgloo-dev")
endif()

set(FASTLEARN_WITH_CUDA OFF)
if(TARGET torch_cuda OR TORCH_CUDA_LIBRARIES)
  set(FASTLEARN_WITH_CUDA ON)
endif()

# Link only LibTorch's own libraries: the toolkit copies that TorchConfig adds (nvrtc, cudart) would
# put the system CUDA directory in our RPATH and shadow the wheel's newer NCCL/CUDA libraries.
set(_torch_libs "")
foreach(_lib IN LISTS TORCH_LIBRARIES)
  if(NOT IS_ABSOLUTE "${_lib}" OR _lib MATCHES "^${TORCH_INSTALL_PREFIX}/")
    list(APPEND _torch_libs "${_lib}")
  endif()
endforeach()

# MKL's link directories are empty-rooted (/lib/intel64, ...) in the wheel's config: keep only real ones.
if(TARGET caffe2::mkl)
  get_target_property(_mkl_dirs caffe2::mkl INTERFACE_LINK_DIRECTORIES)
  if(_mkl_dirs)
    list(FILTER _mkl_dirs INCLUDE REGEX "^${TORCH_INSTALL_PREFIX}")
    set_target_properties(caffe2::mkl PROPERTIES INTERFACE_LINK_DIRECTORIES "${_mkl_dirs}")
  endif()
endif()

add_library(fastlearn_torch INTERFACE)
target_link_libraries(fastlearn_torch INTERFACE ${_torch_libs})
target_include_directories(fastlearn_torch SYSTEM INTERFACE "${FASTLEARN_GLOO_INCLUDE_DIR}")
# Some LibTorch wheels (2.11.0 among them) export std::filesystem functions of their own from libtorch.so; a
# program that binds to those crashes (std::filesystem::remove_all jumped to address 0). Naming the shared
# libstdc++ first, by its path, keeps the standard library's own, also with a toolchain whose -lstdc++ finds
# only the static archive (then nothing is taken from it before libtorch.so is seen).
execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libstdc++.so OUTPUT_VARIABLE _libstdcxx
                OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT IS_ABSOLUTE "${_libstdcxx}" OR NOT EXISTS "${_libstdcxx}")
  find_library(FASTLEARN_LIBSTDCXX NAMES libstdc++.so.6 PATHS ${CMAKE_CXX_IMPLICIT_LINK_DIRECTORIES}
               /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu /usr/lib64 NO_DEFAULT_PATH REQUIRED)
  set(_libstdcxx "${FASTLEARN_LIBSTDCXX}")
endif()
target_link_options(fastlearn_torch INTERFACE "LINKER:--push-state,--no-as-needed" "${_libstdcxx}" "LINKER:--pop-state")
target_compile_definitions(fastlearn_torch INTERFACE USE_C10D_GLOO FASTLEARN_WITH_GLOO=1)
# LibTorch ships fmt headers on its include path, ahead of the system's, and no fmt library: the library's
# core/fmt_library.cpp compiles fmt's out-of-line functions from those headers once (not header-only, which
# compiled them again in every file that formats), so no other fmt library's symbols can mismatch them. It names
# the templates fmt 12's format.h declares extern; a LibTorch with another fmt (an older wheel) gets fmt
# header-only instead, which needs no such list.
set(_fmt_version "")
if(EXISTS "${TORCH_INSTALL_PREFIX}/include/fmt/base.h")  # fmt before 11 has no base.h: header-only
  file(STRINGS "${TORCH_INSTALL_PREFIX}/include/fmt/base.h" _fmt_version REGEX "^#define FMT_VERSION [0-9]+")
  string(REGEX MATCH "[0-9]+$" _fmt_version "${_fmt_version}")
endif()
if(NOT _fmt_version MATCHES "^12[0-9][0-9][0-9][0-9]$")
  message(STATUS "fastlearn: LibTorch's fmt is ${_fmt_version} (not 12.x): fmt header-only")
  target_compile_definitions(fastlearn_torch INTERFACE FMT_HEADER_ONLY)
endif()
if(FASTLEARN_WITH_CUDA)
  target_compile_definitions(fastlearn_torch INTERFACE USE_C10D_NCCL FASTLEARN_WITH_CUDA=1 FASTLEARN_WITH_NCCL=1
                                                       FASTLEARN_CUDA_VERSION="${CUDA_VERSION}")
  # The wheel keeps CUDA/NCCL in site-packages/nvidia/*/lib; the linker must see those, not the toolkit's.
  get_filename_component(_site "${TORCH_INSTALL_PREFIX}/.." ABSOLUTE)
  file(GLOB _nvidia_lib_dirs LIST_DIRECTORIES true "${_site}/nvidia/*/lib")
  if(_nvidia_lib_dirs)
    list(JOIN _nvidia_lib_dirs ":" _rpath_link)
    target_link_options(fastlearn_torch INTERFACE "LINKER:-rpath-link,${_rpath_link}")
  endif()
  # LibTorch's config points CUDA::cudart at the toolkit; use the wheel's copy, the one it runs with.
  file(GLOB _wheel_cudart "${_site}/nvidia/*/lib/libcudart.so.*")
  if(TARGET CUDA::cudart AND _wheel_cudart)
    list(GET _wheel_cudart 0 _wheel_cudart)
    set_target_properties(CUDA::cudart PROPERTIES IMPORTED_LOCATION "${_wheel_cudart}")
  endif()
endif()
message(STATUS "fastlearn: LibTorch ${Torch_VERSION} at ${TORCH_INSTALL_PREFIX}; CUDA+NCCL: ${FASTLEARN_WITH_CUDA}; Gloo: ON")
