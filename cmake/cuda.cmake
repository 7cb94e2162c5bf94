# cuda.cmake — the CUDA backend (src/backend/cuda, Hopper sm_90a) and its GPU
# unit test. Included from CMakeLists.txt after dsv4core is defined.
#   -DDSV4_CUDA=ON    build it (error when no CUDA compiler)
#   -DDSV4_CUDA=AUTO  build it when check_language(CUDA) finds nvcc (default)
#   -DDSV4_CUDA=OFF   do not
#   -DDSV4_CUDA_SHARED=ON  the backend as a shared library (libdsv4cuda.so beside
#                     the binaries): one copy of the device code instead of one per
#                     binary, so a build fits what travels to a GPU machine
# nvcc is looked for in /usr/local/cuda/bin when it is not on PATH.
set(DSV4_CUDA AUTO CACHE STRING "Build the CUDA backend: ON, OFF or AUTO")
set_property(CACHE DSV4_CUDA PROPERTY STRINGS ON OFF AUTO)
set(DSV4_HAVE_CUDA OFF)
if(NOT DSV4_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90a) # every target that links dsv4cuda
    endif()
    enable_language(CUDA)
    set(DSV4_HAVE_CUDA ON)
  elseif(DSV4_CUDA STREQUAL "ON")
    message(FATAL_ERROR "DSV4_CUDA=ON but no CUDA compiler was found (set CMAKE_CUDA_COMPILER)")
  else()
    message(STATUS "dsv4: no CUDA compiler, the CUDA backend is not built")
  endif()
endif()

if(DSV4_HAVE_CUDA)
  find_package(CUDAToolkit REQUIRED)
  file(GLOB DSV4_CUDA_SOURCES CONFIGURE_DEPENDS src/backend/cuda/*.cu src/backend/cuda/mma/*.cu)
  option(DSV4_CUDA_SHARED "Build the CUDA backend as a shared library" OFF)
  if(DSV4_CUDA_SHARED)
    add_library(dsv4cuda SHARED ${DSV4_CUDA_SOURCES})
  else()
    add_library(dsv4cuda STATIC ${DSV4_CUDA_SOURCES})
  endif()
  # The directory's C flags (-Werror, -mavx2, ...) are not nvcc flags: start clean.
  set_property(TARGET dsv4cuda PROPERTY COMPILE_OPTIONS "")
  set_target_properties(dsv4cuda PROPERTIES CUDA_ARCHITECTURES 90a CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
                                            POSITION_INDEPENDENT_CODE ON)
  target_include_directories(dsv4cuda PUBLIC src)
  # No --use_fast_math; --fmad=false: every fused multiply-add is an explicit fmaf
  # (the reduction orders are written out; design.md §1).
  target_compile_options(dsv4cuda PRIVATE --fmad=false -lineinfo -D_GNU_SOURCE
                                          -Xcompiler=-Wall,-Wextra --Werror=all-warnings)
  target_compile_definitions(dsv4cuda PUBLIC DSV4_HAVE_CUDA=1)
  if(DSV4_TEST_HOOKS)
    target_compile_definitions(dsv4cuda PRIVATE DSV4_TEST_HOOKS=1)
  endif()
  # The static runtime: binaries need only the driver (libcuda) where they run.
  target_link_libraries(dsv4cuda PUBLIC CUDA::cudart_static)
  target_link_libraries(dsv4core PUBLIC dsv4cuda)

  # the CUDA kernel benchmark (src/bench/kbench_cuda.cu), built like the
  # backend, in the bench library rather than the backend's
  file(GLOB DSV4_BENCH_CUDA_SOURCES CONFIGURE_DEPENDS src/bench/*.cu)
  add_library(dsv4bench_cuda STATIC ${DSV4_BENCH_CUDA_SOURCES})
  set_property(TARGET dsv4bench_cuda PROPERTY COMPILE_OPTIONS "")
  set_target_properties(dsv4bench_cuda PROPERTIES CUDA_ARCHITECTURES 90a CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
                                                  POSITION_INDEPENDENT_CODE ON)
  target_compile_options(dsv4bench_cuda PRIVATE --fmad=false -lineinfo -D_GNU_SOURCE
                                                -Xcompiler=-Wall,-Wextra --Werror=all-warnings)
  target_link_libraries(dsv4bench_cuda PUBLIC dsv4cuda)
  target_link_libraries(dsv4bench PUBLIC dsv4bench_cuda)

  # GPU unit test (scripts/gpu-test.sh runs it with the rest of the GPU suite)
  add_executable(test_cuda_ops tests/gpu/test_cuda_ops.c)
  target_include_directories(test_cuda_ops PRIVATE src)
  target_link_libraries(test_cuda_ops PRIVATE dsv4core m) # the CPU backend: GPU = CPU bits for MXFP4
  # its references are computed in double on purpose
  target_compile_options(test_cuda_ops PRIVATE -Wno-double-promotion)
  set_target_properties(test_cuda_ops PROPERTIES LINKER_LANGUAGE CUDA)

  # The GPU tests in ctest (LABELS gpu; `ctest -L gpu`): skipped (77) where
  # tests/gpu/gpu_probe finds no CUDA device. The model tests run on the GPU
  # as scripts/gpu-test.sh runs them (DSV4_TEST_BACKEND=cuda).
  add_executable(gpu_probe tests/gpu/gpu_probe.c)
  target_link_libraries(gpu_probe PRIVATE CUDA::cudart_static)
  set(_gpu_run bash ${CMAKE_SOURCE_DIR}/tests/gpu/run.sh $<TARGET_FILE:gpu_probe>)
  add_test(NAME test_cuda_ops COMMAND ${_gpu_run} $<TARGET_FILE:test_cuda_ops>)
  add_test(NAME test_cuda_ops_noside COMMAND ${_gpu_run} $<TARGET_FILE:test_cuda_ops>)
  set_tests_properties(test_cuda_ops_noside PROPERTIES ENVIRONMENT "DSV4_CUDA_SIDE=0")
  foreach(_t test_reference test_batch test_intermediates)
    add_test(NAME ${_t}_cuda COMMAND ${_gpu_run} $<TARGET_FILE:${_t}> WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
    set_tests_properties(${_t}_cuda PROPERTIES ENVIRONMENT "DSV4_TEST_BACKEND=cuda")
  endforeach()
  set_tests_properties(test_cuda_ops test_cuda_ops_noside test_reference_cuda test_batch_cuda test_intermediates_cuda
                       PROPERTIES LABELS gpu SKIP_RETURN_CODE 77)
endif()

if(DSV4_HAVE_CUDA)
  # Targets made before CUDA was enabled link dsv4cuda through dsv4core: give
  # them the architecture too (CMP0104).
  get_property(_dsv4_targets DIRECTORY PROPERTY BUILDSYSTEM_TARGETS)
  foreach(_t ${_dsv4_targets})
    get_target_property(_arch ${_t} CUDA_ARCHITECTURES)
    if(NOT _arch)
      set_target_properties(${_t} PROPERTIES CUDA_ARCHITECTURES 90a)
    endif()
    set_target_properties(${_t} PROPERTIES CUDA_RUNTIME_LIBRARY Static)
  endforeach()
endif()
