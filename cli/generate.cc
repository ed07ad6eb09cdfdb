#include "cli/generate.h"

#include <cstdio>
#include <optional>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "engine/runtime/local_engine.h"

ABSL_FLAG(std::string, prompt, "", "Prompt text (generate)");
ABSL_FLAG(bool, chat, false, "Treat --prompt as a user message and apply the model's chat template");
ABSL_FLAG(std::string, system, "", "System message with --chat (default: the template's)");
ABSL_FLAG(int64_t, max_tokens, 128, "Most tokens to generate");
ABSL_FLAG(double, temperature, 0.0, "Sampling temperature; 0 is greedy");
ABSL_FLAG(double, top_p, 1.0, "Nucleus sampling mass in (0, 1]");
ABSL_FLAG(int32_t, top_k, 0, "Sample among the k most likely tokens; 0 is off");
ABSL_FLAG(double, min_p, 0.0, "Drop tokens below min_p times the top probability");
ABSL_FLAG(double, repetition_penalty, 1.0, "Repetition penalty (1 is off)");
ABSL_FLAG(int64_t, seed, -1, "Random seed; the same seed gives the same text. -1 picks one");
ABSL_FLAG(std::vector<std::string>, stop, {}, "Comma-separated stop strings");
ABSL_FLAG(int32_t, threads, 0, "Compute threads; 0 uses every core");

namespace tandem {
namespace {

int ExitCode(const absl::Status& status) {
  std::fprintf(stderr, "\nerror: %s\n", status.ToString().c_str());
  return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace

int RunGenerate(const std::string& model_path) {
  LocalEngine::Options options;
  options.forward.num_threads = absl::GetFlag(FLAGS_threads);
  auto engine = LocalEngine::Open(model_path, options);
  if (!engine.ok()) return ExitCode(engine.status());

  const std::string prompt = absl::GetFlag(FLAGS_prompt);
  absl::StatusOr<std::vector<int32_t>> tokens = (*engine)->EncodePrompt(prompt);
  if (absl::GetFlag(FLAGS_chat)) {
    std::vector<ChatMessage> messages;
    if (!absl::GetFlag(FLAGS_system).empty()) {
      messages.push_back({"system", absl::GetFlag(FLAGS_system)});
    }
    messages.push_back({"user", prompt});
    tokens = (*engine)->EncodeChat(messages);
  }
  if (!tokens.ok()) return ExitCode(tokens.status());

  GenerationRequest request;
  request.prompt = *tokens;
  sampling::SamplingOptions& s = request.sampling;
  s.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  s.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
  s.top_p = static_cast<float>(absl::GetFlag(FLAGS_top_p));
  s.top_k = absl::GetFlag(FLAGS_top_k);
  s.min_p = static_cast<float>(absl::GetFlag(FLAGS_min_p));
  s.repetition_penalty = static_cast<float>(absl::GetFlag(FLAGS_repetition_penalty));
  if (absl::GetFlag(FLAGS_seed) >= 0) s.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
  s.stop = absl::GetFlag(FLAGS_stop);

  GenerationStats stats;
  sampling::FinishReason finish = sampling::FinishReason::kNone;
  const absl::Status status = (*engine)->Generate(
      {request},
      [&](const GenerationDelta& d) {
        std::fwrite(d.text.data(), 1, d.text.size(), stdout);
        std::fflush(stdout);
        finish = d.finish;
      },
      &stats);
  if (!status.ok()) return ExitCode(status);
  std::printf("\n");
  std::fprintf(stderr,
               "[%s] prompt: %lld tokens in %.3f s (%.1f tokens/s); generated: %lld tokens in "
               "%.3f s (%.1f tokens/s)\n",
               std::string(sampling::FinishReasonName(finish)).c_str(),
               static_cast<long long>(stats.prompt_tokens), stats.prefill_seconds,
               stats.prefill_seconds > 0 ? stats.prompt_tokens / stats.prefill_seconds : 0.0,
               static_cast<long long>(stats.generated_tokens),
               stats.prefill_seconds + stats.decode_seconds,
               stats.decode_seconds > 0 ? (stats.generated_tokens - 1) / stats.decode_seconds : 0.0);
  return 0;
}

}  // namespace tandem
