// Fuzzes the proto -> engine conversion of a request (proto/conversion.h) and what the engine
// does with its result: the input is a serialized tandem.v1.GenerateRequest, as a worker gets it
// over gRPC. Its SamplingParams become SamplingOptions, which are validated as a worker does on
// Add; accepted ones make a StopChecker that is fed a few tokens.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/sampling/sampling_options.h"
#include "engine/sampling/stop_checker.h"
#include "proto/conversion.h"
#include "tandem/v1/inference.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tandem::v1::GenerateRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  const tandem::sampling::SamplingOptions options = tandem::SamplingFromProto(request.sampling());
  constexpr int kVocab = 1000;
  constexpr int kContext = 2048;
  if (!tandem::sampling::ValidateSamplingOptions(options, kVocab, kContext).ok()) return 0;
  const int64_t prompt_tokens = request.has_token_ids() ? request.token_ids().ids_size() : 10;
  (void)tandem::sampling::ValidatePromptLength(options, prompt_tokens, kContext);
  const std::vector<int32_t> eos = {2};
  auto stop = tandem::sampling::StopChecker::Create(
      options, {.eos_token_ids = eos, .prompt_tokens = 10, .max_context = kContext});
  if (!stop.ok()) return 0;
  const char* pieces[] = {"Hel", "lo", " wor", "ld", "\n\n", "END", "\xe6\x97", "\xa5", ""};
  int32_t token = 3;
  for (const char* piece : pieces) {
    const tandem::sampling::StopStep step = stop->Append(token++, piece);
    (void)tandem::FinishReasonToProto(step.finish);
    if (step.finish != tandem::sampling::FinishReason::kNone) break;
  }
  (void)stop->Append(2, "");
  (void)stop->Flush();
  return 0;
}
