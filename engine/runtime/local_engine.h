// A whole model in one process: load a GGUF file, tokenize, and generate text for a set of
// requests decoded together (every step carries one token of each running sequence, after their
// prompts were prefilled). What `tandem generate` and the engine benchmark run; the workers' full
// scheduler (continuous batching, prefix reuse, preemption) builds on the same parts.
//
//   ASSIGN_OR_RETURN(auto engine, LocalEngine::Open(path, {.num_threads = 4}));
//   ASSIGN_OR_RETURN(std::vector<int32_t> prompt, engine->EncodeChat({{"user", "Hi"}}));
//   RETURN_IF_ERROR(engine->Generate({{.prompt = prompt, .sampling = {.max_tokens = 64}}},
//                                    [](const GenerationDelta& d) { std::cout << d.text; }));
//
// Not thread-safe: one thread calls Generate at a time.
#ifndef TANDEM_ENGINE_RUNTIME_LOCAL_ENGINE_H_
#define TANDEM_ENGINE_RUNTIME_LOCAL_ENGINE_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/runtime/cpu_forward.h"
#include "engine/sampling/sampler.h"
#include "engine/sampling/sampling_options.h"
#include "engine/sampling/stop_checker.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/tokenizer.h"

namespace tandem {

struct GenerationRequest {
  std::vector<int32_t> prompt;  // token ids, not empty
  sampling::SamplingOptions sampling;
};

// One new token of request `index`. `text` holds whole UTF-8 characters only and omits stop
// strings and stop tokens; it may be empty while text is held back.
struct GenerationDelta {
  size_t index = 0;
  int32_t token = 0;
  std::string text;
  std::optional<float> logprob;  // when SamplingOptions::logprobs > 0
  std::vector<sampling::TokenLogprob> top_logprobs;
  // kNone while the request goes on; its last delta carries why it ended.
  sampling::FinishReason finish = sampling::FinishReason::kNone;
};

struct GenerationStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double prefill_seconds = 0;  // steps that computed prompts
  double decode_seconds = 0;   // steps that computed one token per running request
  int64_t decode_steps = 0;
};

class LocalEngine {
 public:
  struct Options {
    CpuForward::Options forward;
    // KV blocks in the pool; 0 sizes it for `max_batch` sequences of the model's full context
    // (capped at 4096 tokens each).
    int64_t kv_blocks = 0;
    int64_t max_batch = 32;
    // Longest prompt piece computed in one step; longer prompts are prefilled in chunks.
    int64_t prefill_chunk = 512;
  };

  static absl::StatusOr<std::unique_ptr<LocalEngine>> Open(const std::string& model_path,
                                                           const Options& options);

  const ModelConfig& config() const { return model_.config; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  // The model's chat template, or the error that explains why it cannot be rendered.
  const absl::StatusOr<ChatTemplate>& chat_template() const { return chat_template_; }
  int64_t kv_pool_bytes() const;

  // The prompt's token ids (BOS added as the model asks; special tokens in the text are parsed).
  std::vector<int32_t> EncodePrompt(absl::string_view text) const;
  // The chat rendered by the model's template, with the generation prompt, as token ids.
  absl::StatusOr<std::vector<int32_t>> EncodeChat(const std::vector<ChatMessage>& messages) const;

  // Generates for all `requests` together and calls `on_delta` for every new token, in order.
  // INVALID_ARGUMENT (naming the request) for an empty prompt, a token id outside the
  // vocabulary, a prompt plus max_tokens over the context, or invalid sampling options;
  // RESOURCE_EXHAUSTED when the KV pool or max_batch cannot hold the requests. Nothing is
  // generated when any request is invalid. A request without max_tokens generates until a stop
  // condition or the end of the context.
  absl::Status Generate(absl::Span<const GenerationRequest> requests,
                        const std::function<void(const GenerationDelta&)>& on_delta,
                        GenerationStats* stats = nullptr);

 private:
  LocalEngine(LoadedModel model, const Options& options);

  LoadedModel model_;
  Options options_;
  std::unique_ptr<Tokenizer> tokenizer_;
  absl::StatusOr<ChatTemplate> chat_template_;
  std::unique_ptr<CpuForward> forward_;
  std::unique_ptr<KvStorage> kv_;
  std::vector<int32_t> eos_ids_;
};

}  // namespace tandem

#endif  // TANDEM_ENGINE_RUNTIME_LOCAL_ENGINE_H_
