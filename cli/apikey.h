// `tandem apikey --tenant=NAME [--rps=N] [--concurrency=N]`: prints a fresh API key, once, and the
// line of the router's --api_keys_file that lets it in (docs/security.md).
#ifndef TANDEM_CLI_APIKEY_H_
#define TANDEM_CLI_APIKEY_H_

namespace tandem {

// Returns the process's exit status: 0, or 2 for bad flags, 1 when no key could be made.
int RunApiKey();

}  // namespace tandem

#endif  // TANDEM_CLI_APIKEY_H_
