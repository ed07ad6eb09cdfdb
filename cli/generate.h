// `tandem generate`: text generation in this process, or on a running cluster with --url (its
// gRPC API, tandem.v1.Inference), streamed to stdout, with the prompt and generation speed
// reported on stderr at the end. Its flags are defined in generate.cc.
#ifndef TANDEM_CLI_GENERATE_H_
#define TANDEM_CLI_GENERATE_H_

#include <string>

namespace tandem {

// Returns the process exit code: 0 on success, 2 for invalid input, 1 for other failures.
// `model_path` is unused with --url (the cluster has its model).
int RunGenerate(const std::string& model_path);

}  // namespace tandem

#endif  // TANDEM_CLI_GENERATE_H_
