# The libtorch inside the installed `torch` wheel, found through the Python that has it:
# SALUS_PYTHON (default: the project's .venv, else python3 on PATH). Defines
#   salus::c10    (libc10: what salus_torch needs)
#   salus::torch  (libtorch, libtorch_cpu, libc10 and the C++ API headers: for libtorch programs)
#   salus::torch_cuda  (libtorch_cuda, libc10_cuda and the CUDA headers: what salus_torch_cuda
#                       needs; only where the wheel has its CUDA libraries and the headers exist)
# and sets SALUS_TORCH_FOUND and SALUS_TORCH_CUDA_FOUND. The wheel's own TorchConfig.cmake is not used: it looks for the CUDA
# libraries the wheel was built with (cuDNN, NVTX...), which a machine without a GPU lacks.
set(SALUS_TORCH_FOUND OFF)
set(SALUS_TORCH_CUDA_FOUND OFF)
if(NOT SALUS_PYTHON)
  if(EXISTS ${PROJECT_SOURCE_DIR}/.venv/bin/python)
    set(SALUS_PYTHON ${PROJECT_SOURCE_DIR}/.venv/bin/python)
  elseif(Python_EXECUTABLE)
    set(SALUS_PYTHON ${Python_EXECUTABLE})
  else()
    find_program(SALUS_PYTHON python3)
  endif()
endif()
if(SALUS_PYTHON)
  execute_process(
    COMMAND ${SALUS_PYTHON} -c "import os, torch; print(os.path.dirname(torch.__file__))"
    OUTPUT_VARIABLE SALUS_TORCH_DIR OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET
    RESULT_VARIABLE torch_status)
  if(torch_status EQUAL 0 AND EXISTS ${SALUS_TORCH_DIR}/lib/libc10.so)
    set(SALUS_TORCH_FOUND ON)
    set(SALUS_TORCH_LIB_DIR ${SALUS_TORCH_DIR}/lib)
    add_library(salus::c10 SHARED IMPORTED)
    set_target_properties(salus::c10 PROPERTIES
      IMPORTED_LOCATION ${SALUS_TORCH_LIB_DIR}/libc10.so
      INTERFACE_INCLUDE_DIRECTORIES ${SALUS_TORCH_DIR}/include
      INTERFACE_COMPILE_DEFINITIONS "_GLIBCXX_USE_CXX11_ABI=1")
    add_library(salus::torch INTERFACE IMPORTED)
    set_target_properties(salus::torch PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES
        "${SALUS_TORCH_DIR}/include;${SALUS_TORCH_DIR}/include/torch/csrc/api/include"
      INTERFACE_LINK_LIBRARIES
        "${SALUS_TORCH_LIB_DIR}/libtorch.so;${SALUS_TORCH_LIB_DIR}/libtorch_cpu.so;salus::c10")
    message(STATUS "libtorch: ${SALUS_TORCH_DIR} (through ${SALUS_PYTHON})")
    # The CUDA half: the wheel's CUDA libraries (a CPU-only wheel has none) and the toolkit's
    # headers (c10's CUDA headers include cuda_runtime_api.h). Linked, not loaded with dlopen: the
    # torch module has loaded them already where salus_torch_cuda is used.
    set(torch_cuda_lib ${SALUS_TORCH_LIB_DIR}/libtorch_cuda.so)
    set(c10_cuda_lib ${SALUS_TORCH_LIB_DIR}/libc10_cuda.so)
    find_path(SALUS_CUDA_RUNTIME_INCLUDE cuda_runtime_api.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    if(EXISTS ${torch_cuda_lib} AND EXISTS ${c10_cuda_lib} AND SALUS_CUDA_RUNTIME_INCLUDE)
      set(SALUS_TORCH_CUDA_FOUND ON)
      add_library(salus::torch_cuda INTERFACE IMPORTED)
      set_target_properties(salus::torch_cuda PROPERTIES
        INTERFACE_INCLUDE_DIRECTORIES "${SALUS_CUDA_RUNTIME_INCLUDE}"
        INTERFACE_LINK_LIBRARIES "${torch_cuda_lib};${c10_cuda_lib};salus::torch")
      message(STATUS "libtorch_cuda: found (salus_torch_cuda is built)")
    else()
      message(STATUS "libtorch_cuda or the CUDA headers not found: salus_torch_cuda is not built")
    endif()
  else()
    message(STATUS "libtorch not found through ${SALUS_PYTHON}: salus_torch is not built")
  endif()
endif()
