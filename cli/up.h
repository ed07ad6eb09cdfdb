// `tandem up`: a whole cluster on this machine, as separate processes on loopback: N prefill and
// M decode workers (or decode workers only with --aggregated), then the router in front of them.
// Waits until the router reports healthy, prints the endpoints and a curl example, and stops
// everything on Ctrl-C or SIGTERM (or when a process dies).
#ifndef TANDEM_CLI_UP_H_
#define TANDEM_CLI_UP_H_

#include <string>

namespace tandem {

// `bin_dir` holds tandem-router, tandem-prefill and tandem-decode. Returns the exit status.
int RunUp(const std::string& model_path, const std::string& bin_dir);

}  // namespace tandem

#endif  // TANDEM_CLI_UP_H_
