# System dependencies, all from Debian 12 packages installed by scripts/setup.sh.
# A missing one stops the configure step with the package that provides it.

macro(tandem_require_package name debian_package)
  find_package(${name} QUIET ${ARGN})
  if(NOT ${name}_FOUND)
    message(FATAL_ERROR
      "tandem: ${name} was not found. Install the Debian package '${debian_package}' "
      "(or run scripts/setup.sh, which installs every dependency).")
  endif()
endmacro()

find_package(Threads REQUIRED)
tandem_require_package(absl libabsl-dev)
tandem_require_package(Protobuf libprotobuf-dev)
tandem_require_package(gRPC libgrpc++-dev)
tandem_require_package(prometheus-cpp prometheus-cpp-dev)
tandem_require_package(ucx libucx-dev)
tandem_require_package(nlohmann_json nlohmann-json3-dev)
# OpenSSL's libcrypto: the router's API keys (SHA-256 digests, constant-time compare, CSPRNG for
# `tandem apikey`). gRPC links it already.
tandem_require_package(OpenSSL libssl-dev)
# libevent's HTTP server carries the router's OpenAI API: one event loop for thousands of
# streaming connections. Debian ships it with pkg-config files only.
find_package(PkgConfig REQUIRED)
# libevent_openssl: its bufferevents carry the router's HTTPS (TLS over OpenSSL).
pkg_check_modules(LIBEVENT IMPORTED_TARGET libevent_core libevent_extra libevent_pthreads
                  libevent_openssl)
if(NOT LIBEVENT_FOUND)
  message(FATAL_ERROR "tandem: libevent was not found. Install the Debian package 'libevent-dev'.")
endif()
# utf8proc: Unicode NFC normalization, which Hugging Face tokenizers (Qwen2/Qwen3 tokenizer.json)
# apply to text before splitting it; its tables track the Unicode version PyPI tokenizers uses.
pkg_check_modules(UTF8PROC IMPORTED_TARGET libutf8proc)
if(NOT UTF8PROC_FOUND)
  message(FATAL_ERROR "tandem: utf8proc was not found. Install the Debian package 'libutf8proc-dev'.")
endif()
if(TANDEM_BUILD_TESTS)
  tandem_require_package(GTest libgtest-dev)
  tandem_require_package(benchmark libbenchmark-dev)
endif()

find_program(TANDEM_PROTOC protoc)
find_program(TANDEM_GRPC_CPP_PLUGIN grpc_cpp_plugin)
if(NOT TANDEM_PROTOC OR NOT TANDEM_GRPC_CPP_PLUGIN)
  message(FATAL_ERROR
    "tandem: protoc and grpc_cpp_plugin are needed. Install the Debian packages "
    "'protobuf-compiler' and 'protobuf-compiler-grpc' (or run scripts/setup.sh).")
endif()

find_path(TANDEM_XXHASH_INCLUDE xxhash.h)
find_library(TANDEM_XXHASH_LIB xxhash)
if(NOT TANDEM_XXHASH_INCLUDE OR NOT TANDEM_XXHASH_LIB)
  message(FATAL_ERROR "tandem: xxhash was not found. Install the Debian package 'libxxhash-dev'.")
endif()
add_library(tandem_xxhash INTERFACE)
target_include_directories(tandem_xxhash INTERFACE "${TANDEM_XXHASH_INCLUDE}")
target_link_libraries(tandem_xxhash INTERFACE "${TANDEM_XXHASH_LIB}")
add_library(xxhash::xxhash ALIAS tandem_xxhash)

# xgrammar's C++ core (grammar-constrained decoding for response_format): not a Debian package,
# built once from its pinned PyPI sdist into a cache by scripts/build_xgrammar.sh (which
# scripts/setup.sh and the Docker build stage run). A static library: nothing to install at runtime.
set(TANDEM_XGRAMMAR_VERSION 0.2.9)
if(DEFINED ENV{XDG_CACHE_HOME} AND NOT "$ENV{XDG_CACHE_HOME}" STREQUAL "")
  set(_tandem_cache "$ENV{XDG_CACHE_HOME}")
else()
  set(_tandem_cache "$ENV{HOME}/.cache")
endif()
set(TANDEM_XGRAMMAR_PREFIX "${_tandem_cache}/tandem/xgrammar/${TANDEM_XGRAMMAR_VERSION}"
    CACHE PATH "Where scripts/build_xgrammar.sh installed xgrammar's C++ core")
find_path(TANDEM_XGRAMMAR_INCLUDE xgrammar/xgrammar.h
          PATHS "${TANDEM_XGRAMMAR_PREFIX}/include" NO_DEFAULT_PATH)
find_library(TANDEM_XGRAMMAR_LIB NAMES libxgrammar.a
             PATHS "${TANDEM_XGRAMMAR_PREFIX}/lib" NO_DEFAULT_PATH)
if(NOT TANDEM_XGRAMMAR_INCLUDE OR NOT TANDEM_XGRAMMAR_LIB)
  message(FATAL_ERROR
    "tandem: xgrammar ${TANDEM_XGRAMMAR_VERSION} was not found in ${TANDEM_XGRAMMAR_PREFIX}. "
    "Run scripts/setup.sh (or scripts/build_xgrammar.sh alone), which builds it once from its PyPI "
    "sdist; or point -DTANDEM_XGRAMMAR_PREFIX=<dir> at an install with include/ and lib/.")
endif()
add_library(tandem_xgrammar INTERFACE)
# SYSTEM: its headers are not held to our -Werror warnings.
target_include_directories(tandem_xgrammar SYSTEM INTERFACE "${TANDEM_XGRAMMAR_INCLUDE}")
target_link_libraries(tandem_xgrammar INTERFACE "${TANDEM_XGRAMMAR_LIB}")
target_compile_definitions(tandem_xgrammar INTERFACE XGRAMMAR_ENABLE_CPPTRACE=0
                                                     XGRAMMAR_ENABLE_INTERNAL_CHECK=0)
add_library(xgrammar::xgrammar ALIAS tandem_xgrammar)
