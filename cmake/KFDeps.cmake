# Finds every third-party package once, so component CMakeLists only link targets.
# Carried dependencies (the GPU machine lacks TBB and seccomp.h) live under
# KF_DEPS_PREFIX, an unpacked Debian tree; see tools/gpu-check.

set(KF_DEPS_PREFIX "" CACHE PATH "Extra prefix with carried headers/libs (e.g. .deps/usr)")
if(KF_DEPS_PREFIX)
  list(PREPEND CMAKE_PREFIX_PATH "${KF_DEPS_PREFIX}" "${KF_DEPS_PREFIX}/lib/x86_64-linux-gnu/cmake")
  include_directories(SYSTEM "${KF_DEPS_PREFIX}/include")
endif()

# --- Python with the pinned torch (setup.sh makes .venv; the GPU machine has its own)
if(NOT KF_PYTHON)
  if(EXISTS "${CMAKE_SOURCE_DIR}/.venv/bin/python3")
    set(KF_PYTHON "${CMAKE_SOURCE_DIR}/.venv/bin/python3")
  else()
    find_program(KF_PYTHON python3 REQUIRED)
  endif()
endif()
set(KF_PYTHON "${KF_PYTHON}" CACHE FILEPATH "Python interpreter that has torch")
execute_process(
  COMMAND "${KF_PYTHON}" -c "import torch,os;print(torch.utils.cmake_prefix_path);print(os.path.dirname(torch.__file__))"
  OUTPUT_VARIABLE _kf_torch_out RESULT_VARIABLE _kf_torch_rc OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _kf_torch_rc EQUAL 0)
  message(FATAL_ERROR "KernelForge: '${KF_PYTHON}' cannot import torch; run ./setup.sh first")
endif()
string(REPLACE "\n" ";" _kf_torch_out "${_kf_torch_out}")
list(GET _kf_torch_out 0 _kf_torch_prefix)
list(GET _kf_torch_out 1 KF_TORCH_DIR)
list(APPEND CMAKE_PREFIX_PATH "${_kf_torch_prefix}")

# --- CUDA: optional at build time of the host code, required for the CUDA backend.
include(CheckLanguage)
check_language(CUDA)
if(CMAKE_CUDA_COMPILER)
  if(NOT CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90)
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  set(KF_HAVE_CUDA ON)
  # Torch's config must not try to detect a GPU on a machine that has none.
  set(ENV{TORCH_CUDA_ARCH_LIST} "9.0")
else()
  set(KF_HAVE_CUDA OFF)
endif()

find_package(Torch REQUIRED)
# Torch's ABI define is the one global flag we allow (STYLE.md).
add_compile_options(${TORCH_CXX_FLAGS})

find_package(Threads REQUIRED)
# TBB: required by the evaluator's compile pool; the GPU machine lacks it unless carried (tools/gpu-check).
find_package(TBB QUIET)
find_package(Boost 1.74 REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(CLI11 REQUIRED)
find_package(yaml-cpp REQUIRED)
if(TARGET yaml-cpp::yaml-cpp)
  set(KF_YAML yaml-cpp::yaml-cpp)
else()
  set(KF_YAML yaml-cpp)
endif()
if(KF_BUILD_TESTS)
  find_package(GTest REQUIRED)
  include(GoogleTest)
endif()

# libseccomp: the GPU machine has only the runtime .so.2, so accept that.
find_path(KF_SECCOMP_INCLUDE seccomp.h)
find_library(KF_SECCOMP_LIB NAMES seccomp libseccomp.so.2)
if(KF_SECCOMP_INCLUDE AND KF_SECCOMP_LIB)
  add_library(kf_seccomp INTERFACE)
  target_include_directories(kf_seccomp SYSTEM INTERFACE ${KF_SECCOMP_INCLUDE})
  target_link_libraries(kf_seccomp INTERFACE ${KF_SECCOMP_LIB})
  set(KF_HAVE_SECCOMP ON)
else()
  set(KF_HAVE_SECCOMP OFF)
endif()

# NCCL: prefer the one that ships with torch's wheel (same version torch was built with).
find_path(KF_NCCL_INCLUDE nccl.h HINTS "${KF_TORCH_DIR}/../nvidia/nccl/include" ${CUDAToolkit_INCLUDE_DIRS})
find_library(KF_NCCL_LIB NAMES nccl libnccl.so.2 HINTS "${KF_TORCH_DIR}/../nvidia/nccl/lib" ${CUDAToolkit_LIBRARY_DIR})
if(KF_HAVE_CUDA AND KF_NCCL_INCLUDE AND KF_NCCL_LIB)
  add_library(kf_nccl INTERFACE)
  target_include_directories(kf_nccl SYSTEM INTERFACE ${KF_NCCL_INCLUDE})
  target_link_libraries(kf_nccl INTERFACE ${KF_NCCL_LIB} CUDA::cudart)
  set(KF_HAVE_NCCL ON)
else()
  set(KF_HAVE_NCCL OFF)
endif()

message(STATUS "KernelForge: torch=${Torch_VERSION} cuda=${KF_HAVE_CUDA} nccl=${KF_HAVE_NCCL} seccomp=${KF_HAVE_SECCOMP} python=${KF_PYTHON}")

# Helper: a GoogleTest executable registered with CTest.
# FIXTURES names CTest fixtures the tests need (e.g. tasks_artifacts: the imported suite).
function(kf_add_test name)
  cmake_parse_arguments(T "" "" "SOURCES;LIBS;FIXTURES" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest_main)
  # Where the tree and the build are, for tests run outside CTest too (env vars win).
  # These compiled-in defaults are what tests rely on: gtest_discover_tests passes only the
  # first of several ENVIRONMENT entries through to the discovered tests.
  target_compile_definitions(${name} PRIVATE KF_SOURCE_DIR_DEFAULT="${CMAKE_SOURCE_DIR}" KF_BUILD_DIR_DEFAULT="${CMAKE_BINARY_DIR}"
                             KF_PYTHON_DEFAULT="${KF_PYTHON}")
  set(_props ENVIRONMENT "KF_SOURCE_DIR=${CMAKE_SOURCE_DIR}\\;KF_BUILD_DIR=${CMAKE_BINARY_DIR}\\;KF_PYTHON=${KF_PYTHON}")
  if(T_FIXTURES)
    list(APPEND _props FIXTURES_REQUIRED "${T_FIXTURES}")
  endif()
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 120 PROPERTIES ${_props})
endfunction()
