// `tandem generate`: text generation in this process, streamed to stdout, with the prompt and
// generation speed reported on stderr at the end. Its flags are defined in generate.cc.
#ifndef TANDEM_CLI_GENERATE_H_
#define TANDEM_CLI_GENERATE_H_

#include <string>

namespace tandem {

// Returns the process exit code: 0 on success, 2 for invalid input, 1 for other failures.
int RunGenerate(const std::string& model_path);

}  // namespace tandem

#endif  // TANDEM_CLI_GENERATE_H_
