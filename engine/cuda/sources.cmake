# The CUDA kernels and their checks, listed once for both builds: the project's (engine/cuda/
# CMakeLists.txt, when nvcc is found) and the standalone one for a bare GPU machine
# (engine/cuda/standalone/, scripts/gpu_check.sh). Paths are relative to this folder.
#   TANDEM_CUDA_KERNEL_SRCS  one .cu per op
#   TANDEM_CUDA_CHECK_SRCS   the checks (check.h) and their runner
#   TANDEM_CUDA_BENCH_SRCS   the kernels' benchmark (cuda_kernels_bench)
set(TANDEM_CUDA_KERNEL_SRCS)
set(TANDEM_CUDA_CHECK_SRCS check_main.cu)
foreach(_op IN ITEMS elementwise paged_attention matmul)
  if(EXISTS "${CMAKE_CURRENT_LIST_DIR}/${_op}.cu")
    list(APPEND TANDEM_CUDA_KERNEL_SRCS "${CMAKE_CURRENT_LIST_DIR}/${_op}.cu")
  endif()
  if(EXISTS "${CMAKE_CURRENT_LIST_DIR}/${_op}_check.cu")
    list(APPEND TANDEM_CUDA_CHECK_SRCS "${CMAKE_CURRENT_LIST_DIR}/${_op}_check.cu")
  endif()
endforeach()
set(TANDEM_CUDA_BENCH_SRCS "${CMAKE_CURRENT_LIST_DIR}/kernels_bench.cu")
list(TRANSFORM TANDEM_CUDA_CHECK_SRCS PREPEND "${CMAKE_CURRENT_LIST_DIR}/" REGEX "^[^/]")
