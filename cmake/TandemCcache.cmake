# Use ccache for C, C++ and CUDA when it is installed; builds on small machines depend on it.
find_program(TANDEM_CCACHE ccache)
if(TANDEM_CCACHE)
  set(CMAKE_C_COMPILER_LAUNCHER "${TANDEM_CCACHE}")
  set(CMAKE_CXX_COMPILER_LAUNCHER "${TANDEM_CCACHE}")
  set(CMAKE_CUDA_COMPILER_LAUNCHER "${TANDEM_CCACHE}")
  message(STATUS "tandem: using ccache at ${TANDEM_CCACHE}")
endif()
