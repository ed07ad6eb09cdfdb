// Command-line flags with environment mirrors, for `main.cc` files only.
//
// Every flag `--name` defined with ABSL_FLAG in the project can also be set through the
// environment variable `TANDEM_NAME` (upper case, '-' and '.' become '_'), which is how Kubernetes
// manifests configure the binaries. Precedence: command line > environment > the flag's default.
//
//   int main(int argc, char** argv) {
//     std::vector<char*> args = tandem::ParseFlagsWithEnvironment(argc, argv, "usage: ...");
//     ...
//   }
//
// Libraries never read flags: they take Options structs filled in `main`.
#ifndef TANDEM_COMMON_FLAGS_H_
#define TANDEM_COMMON_FLAGS_H_

#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/status.h"

namespace tandem {

inline constexpr absl::string_view kFlagEnvironmentPrefix = "TANDEM_";

// "max_batch" -> "TANDEM_MAX_BATCH".
std::string FlagEnvironmentName(absl::string_view flag_name);

// For every project flag (flags defined inside Abseil are left alone) whose environment variable
// is set, parses its value into the flag. Returns INVALID_ARGUMENT naming the variable, the flag
// and the reason when a value does not parse; the flags already applied keep their new values.
absl::Status ApplyFlagEnvironment();

// Names of set `TANDEM_*` environment variables that match no flag (likely typos), sorted.
// `ignore` lists variables that are used for other purposes.
std::vector<std::string> UnknownFlagEnvironment(const std::vector<std::string>& ignore = {});

// Applies the environment, then parses the command line (which wins). On a bad value it prints
// the error and exits with status 2; `--help` prints `usage` and the flags. Returns the positional
// arguments, argv[0] first. Warns about TANDEM_* variables that match no flag.
// It also installs absl's failure signal handler, so that a crash prints the signal and a
// symbolized stack trace to stderr.
std::vector<char*> ParseFlagsWithEnvironment(int argc, char** argv, absl::string_view usage);

}  // namespace tandem

#endif  // TANDEM_COMMON_FLAGS_H_
