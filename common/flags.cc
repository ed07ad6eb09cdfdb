#include "common/flags.h"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/commandlineflag.h"
#include "absl/debugging/failure_signal_handler.h"
#include "absl/debugging/symbolize.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"

extern char** environ;

namespace tandem {
namespace {

// Flags that Abseil itself defines (--flagfile, --fromenv, --help...) are not mirrored.
bool IsProjectFlag(const absl::CommandLineFlag& flag) {
  const std::string file = flag.Filename();
  return !absl::StrContains(file, "absl/flags/") && !absl::StrContains(file, "absl/log/");
}

}  // namespace

std::string FlagEnvironmentName(absl::string_view flag_name) {
  std::string name = absl::StrCat(kFlagEnvironmentPrefix, flag_name);
  for (char& c : name) {
    c = (c == '-' || c == '.') ? '_' : absl::ascii_toupper(static_cast<unsigned char>(c));
  }
  return name;
}

absl::Status ApplyFlagEnvironment() {
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (!IsProjectFlag(*flag)) continue;
    const std::string env_name = FlagEnvironmentName(name);
    const char* value = std::getenv(env_name.c_str());
    if (value == nullptr) continue;
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("environment variable ", env_name, "='",
                                                     value, "' is not a valid value for --", name,
                                                     ": ", error));
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> UnknownFlagEnvironment(const std::vector<std::string>& ignore) {
  absl::flat_hash_set<std::string> known(ignore.begin(), ignore.end());
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (IsProjectFlag(*flag)) known.insert(FlagEnvironmentName(name));
  }
  std::vector<std::string> unknown;
  for (char** env = environ; env != nullptr && *env != nullptr; ++env) {
    const absl::string_view entry(*env);
    if (!absl::StartsWith(entry, kFlagEnvironmentPrefix)) continue;
    const std::string name(entry.substr(0, entry.find('=')));
    if (!known.contains(name)) unknown.push_back(name);
  }
  std::sort(unknown.begin(), unknown.end());
  return unknown;
}

std::vector<char*> ParseFlagsWithEnvironment(int argc, char** argv, absl::string_view usage) {
  // A crash prints the signal and a symbolized stack to stderr before the process dies, so that
  // a component that fails under load says where (termination signals the programs handle
  // themselves keep their handlers: this runs first).
  if (argc > 0) absl::InitializeSymbolizer(argv[0]);
  absl::FailureSignalHandlerOptions crash;
  crash.call_previous_handler = true;
  absl::InstallFailureSignalHandler(crash);
  // A peer that closes its socket while we write to it is an error on that connection, never the
  // end of the process: libevent's HTTP server, UCX's TCP transport and the metrics exposer write
  // without MSG_NOSIGNAL, and the default action of SIGPIPE is to die silently.
  std::signal(SIGPIPE, SIG_IGN);
  absl::SetProgramUsageMessage(absl::StrCat(
      usage, "\n\nEvery flag --name can also be set with the environment variable TANDEM_NAME; "
             "the command line wins."));
  if (absl::Status status = ApplyFlagEnvironment(); !status.ok()) {
    std::fprintf(stderr, "%s: %s\n", argc > 0 ? argv[0] : "tandem",
                 std::string(status.message()).c_str());
    std::exit(2);
  }
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  for (const std::string& name : UnknownFlagEnvironment()) {
    LOG(WARNING) << "environment variable " << name << " matches no flag of this program";
  }
  return positional;
}

}  // namespace tandem
