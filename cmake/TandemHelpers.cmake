# Build helpers shared by every module.
#
#   tandem_library(NAME <name> SRCS <files...> [CUDA_SRCS <files...>] [DEPS <targets...>]
#                  [TESTS <files...>] [TEST_DEPS <targets...>])
#     Declares the static library `tandem_<name>` (alias `tandem::<name>`). Its tests are the
#     `*_test.cc` files beside it (or TESTS when given), built into one binary `<name>_test`
#     and registered with CTest test by test. CUDA_SRCS are compiled only when CUDA is enabled.
#
#   tandem_test(NAME <name> SRCS <files...> [DEPS <targets...>])
#     A GoogleTest binary registered with CTest test by test, with the label `unit`.
#
#   tandem_binary(NAME <name> SRCS <files...> [DEPS <targets...>])
#     An executable with the project's warning flags.

# Sanitizers apply to every C/C++ file built here (generated code included), never to CUDA.
if(TANDEM_SANITIZE)
  list(JOIN TANDEM_SANITIZE "," _tandem_san)
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=${_tandem_san};-fno-omit-frame-pointer;-fno-sanitize-recover=all>")
  add_link_options("-fsanitize=${_tandem_san}")
endif()

function(tandem_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wnon-virtual-dtor -Woverloaded-virtual
      -Wimplicit-fallthrough -Wformat=2>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall>)
  if(TANDEM_WERROR)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-Werror>
      $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings -Xcompiler=-Werror>)
  endif()
endfunction()

function(tandem_test)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS" ${ARGN})
  if(NOT TANDEM_BUILD_TESTS)
    return()
  endif()
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS} GTest::gmock GTest::gtest_main)
  target_include_directories(${ARG_NAME} PRIVATE "${PROJECT_SOURCE_DIR}" "${PROJECT_BINARY_DIR}/generated")
  tandem_set_warnings(${ARG_NAME})
  # PRE_TEST discovery lists the tests when ctest runs, not at build time: faster builds, and
  # sanitizer builds are not run during the build.
  gtest_discover_tests(${ARG_NAME}
    DISCOVERY_MODE PRE_TEST
    DISCOVERY_TIMEOUT 60
    PROPERTIES LABELS unit TIMEOUT 300)
endfunction()

function(tandem_library)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;CUDA_SRCS;DEPS;TESTS;TEST_DEPS" ${ARGN})
  set(_target tandem_${ARG_NAME})
  set(_srcs ${ARG_SRCS})
  if(TANDEM_HAVE_CUDA)
    list(APPEND _srcs ${ARG_CUDA_SRCS})
  endif()
  add_library(${_target} STATIC ${_srcs})
  add_library(tandem::${ARG_NAME} ALIAS ${_target})
  target_include_directories(${_target} PUBLIC "${PROJECT_SOURCE_DIR}" "${PROJECT_BINARY_DIR}/generated")
  target_link_libraries(${_target} PUBLIC ${ARG_DEPS})
  tandem_set_warnings(${_target})

  set(_tests ${ARG_TESTS})
  if(NOT _tests)
    file(GLOB _tests CONFIGURE_DEPENDS "${CMAKE_CURRENT_SOURCE_DIR}/*_test.cc")
  endif()
  if(_tests)
    tandem_test(NAME ${ARG_NAME}_test SRCS ${_tests} DEPS ${_target} ${ARG_TEST_DEPS})
  endif()
endfunction()

function(tandem_binary)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS})
  tandem_set_warnings(${ARG_NAME})
  set_target_properties(${ARG_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY "${PROJECT_BINARY_DIR}/bin")
endfunction()

#   tandem_py_test(NAME <name> SCRIPT <file.py> [ENV <VAR=value...>] [LABELS <labels...>]
#                  [TIMEOUT <seconds>] [SERIAL])
#     A pytest file run by the project's Python environment (TANDEM_PYTHON, made by
#     scripts/setup.sh). TANDEM_BIN_DIR, TANDEM_SOURCE_DIR and TANDEM_BUILD_DIR are set for it.
#     SERIAL: ctest runs it alone (a test that holds a cluster to latency objectives measures
#     nothing while other tests take the same cores).
#     When that Python is missing the test is still registered and fails with a message saying so.
function(tandem_py_test)
  cmake_parse_arguments(ARG "SERIAL" "NAME;SCRIPT;TIMEOUT" "ENV;LABELS" ${ARGN})
  if(NOT TANDEM_BUILD_TESTS)
    return()
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  if(EXISTS "${TANDEM_PYTHON}")
    add_test(NAME ${ARG_NAME}
      COMMAND "${TANDEM_PYTHON}" -m pytest -q -p no:cacheprovider "${ARG_SCRIPT}")
  else()
    # No silent skip: without the Python environment the test runs and fails, saying why.
    set(_script "${CMAKE_CURRENT_BINARY_DIR}/${ARG_NAME}_missing_python.cmake")
    file(WRITE "${_script}"
      "message(FATAL_ERROR \"${ARG_NAME}: the Python interpreter '${TANDEM_PYTHON}' (TANDEM_PYTHON) "
      "did not exist when CMake ran. Run scripts/setup.sh, which creates .venv with "
      "scripts/requirements.txt, then configure again.\")\n")
    add_test(NAME ${ARG_NAME} COMMAND "${CMAKE_COMMAND}" -P "${_script}")
  endif()
  set_tests_properties(${ARG_NAME} PROPERTIES
    LABELS "${ARG_LABELS};python"
    TIMEOUT ${ARG_TIMEOUT}
    ENVIRONMENT "TANDEM_BIN_DIR=${PROJECT_BINARY_DIR}/bin;TANDEM_SOURCE_DIR=${PROJECT_SOURCE_DIR};TANDEM_BUILD_DIR=${PROJECT_BINARY_DIR};PYTHONDONTWRITEBYTECODE=1;${ARG_ENV}")
  if(ARG_SERIAL)
    set_tests_properties(${ARG_NAME} PROPERTIES RUN_SERIAL TRUE)
  endif()
endfunction()
