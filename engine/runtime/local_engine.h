// A whole model in one process: load a GGUF file, tokenize, and generate for many requests at
// once with continuous batching (engine/sched): requests join and leave the batch at any step,
// long prompts are prefilled in chunks beside running streams, a prompt prefix another request
// already computed is reused from the KV pool's prefix cache, and when KV blocks run out the
// newest, least important sequence is preempted and recomputed later.
//
//   ASSIGN_OR_RETURN(auto engine, LocalEngine::Open(path, {.cpu = {.num_threads = 4}}));
//   ASSIGN_OR_RETURN(std::vector<int32_t> prompt, engine->EncodeChat({{"user", "Hi"}}));
//   RETURN_IF_ERROR(engine->Add(/*id=*/7, {.prompt = prompt, .sampling = {.max_tokens = 64}},
//                               [](const GenerationDelta& d) { std::cout << d.text; }));
//   while (engine->HasWork()) RETURN_IF_ERROR(engine->Step());
//
// Generate() does the same for a fixed set of requests. Not thread-safe: one thread drives it
// (the kernels use their own thread pool).
#ifndef TANDEM_ENGINE_RUNTIME_LOCAL_ENGINE_H_
#define TANDEM_ENGINE_RUNTIME_LOCAL_ENGINE_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "engine/grammar/token_constraint.h"
#include "engine/kv/block_pool.h"
#include "engine/runtime/backend.h"
#include "engine/runtime/cpu_backend.h"
#include "engine/sched/scheduler.h"
#include "engine/sampling/sampler.h"
#include "engine/sampling/sampling_options.h"
#include "engine/sampling/stop_checker.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/tokenizer.h"

namespace tandem {

// This request's K/V of one layer for the tokens a step computed are in the cache.
struct KvLayerDone {
  int64_t layer = 0;
  int64_t first_position = 0;  // the step computed positions first_position ..
  int64_t num_tokens = 0;      // .. first_position + num_tokens - 1
  absl::Span<const int32_t> block_table;  // the request's blocks, position order
};

struct GenerationRequest {
  std::vector<int32_t> prompt;  // token ids, not empty
  sampling::SamplingOptions sampling;
  // Higher runs first and is preempted last (GenerateRequest.priority).
  int priority = 0;
  // The last `prior_output_tokens` tokens of `prompt` were generated earlier for this request,
  // elsewhere (it resumes here after its worker failed). They are replayed through the sampler,
  // the stop checker and the detokenizer, so penalties, the seeded random stream, min/max_tokens
  // (which count them) and stop strings go on as if the request had never moved, and text that
  // was held back there (a partial character, a possible stop string) comes out here. Their own
  // text is not emitted again. In [0, prompt.size()).
  int64_t prior_output_tokens = 0;
  // Called during Step for every layer, as soon as the layer's K/V of this request's tokens in
  // the step are in the cache (a prefill worker sends each layer to the decode worker then).
  // Positions before the first call's first_position came from the prefix cache. On the
  // stepping thread; must not block.
  std::function<void(const KvLayerDone&)> on_kv_layer = nullptr;
  // Keep the request's KV blocks when it ends (finished, cancelled or failed) until
  // LocalEngine::ReleaseKv(id): they stay allocated and unchanged, so that transfers still
  // reading them (a prefill worker's writes to a decode worker, which on_kv_layer started) never
  // read blocks another request reuses. The id stays in use until then.
  bool hold_kv = false;
  // Score the prompt: when > 0, the log-probability of every prompt token after the first given
  // the tokens before it, with this many most likely alternatives (at most sampling::kMaxLogprobs),
  // comes on the request's first delta (GenerationDelta::prompt_logprobs). The prompt is then
  // computed whole, with its logits at every position, one prefill chunk at a time: the prefix
  // cache is not reused for it. Not with prior_output_tokens (a resumed request's first worker
  // scored its prompt): INVALID_ARGUMENT.
  int prompt_logprobs = 0;
};

// One new token of request `index` (the id given to Add, or the request's index in Generate). `text` holds whole UTF-8 characters only and omits stop
// strings and stop tokens; it may be empty while text is held back.
struct GenerationDelta {
  size_t index = 0;
  int32_t token = 0;
  std::string text = {};
  std::optional<float> logprob = std::nullopt;  // when SamplingOptions::logprobs > 0
  std::vector<sampling::TokenLogprob> top_logprobs = {};
  // kNone while the request goes on; its last delta carries why it ended.
  sampling::FinishReason finish = sampling::FinishReason::kNone;
  // On the request's first delta: leading prompt tokens found in this worker's prefix cache
  // (not computed for it). 0 on the others.
  int64_t cached_prompt_tokens = 0;
  // On the request's first delta: seconds from the start of the first engine step that computed
  // any of its prompt tokens to this token, the prompt's computation with the steps it shared
  // (its wait before that is the caller's time to this delta minus this). 0 when no step here
  // computed its prompt (a remote prefill's first token) and on the other deltas.
  double prompt_seconds = 0;
  // On the request's first delta when GenerationRequest::prompt_logprobs > 0: prompt tokens
  // 1 .. n-1 (id, log-probability given the tokens before it, the most likely alternatives there,
  // most likely first). Empty otherwise.
  std::vector<sampling::SampledToken> prompt_logprobs = {};
};

// What Generate did.
struct GenerationStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double prefill_seconds = 0;  // steps that computed prompt tokens (perhaps with decode tokens)
  double decode_seconds = 0;   // steps that computed only decode tokens
  int64_t decode_steps = 0;
  int64_t decode_tokens = 0;  // tokens generated by those steps
};

// What one Step did (feeds StepTiming and the scheduler-overhead benchmark).
struct StepInfo {
  int64_t batch_size = 0;  // sequences in the step
  int64_t prefill_tokens = 0;
  int64_t decode_tokens = 0;
  int64_t context_tokens = 0;  // sum over the batch of the positions each one attends to
  // Sum over the step's tokens of the positions each attends to: n * start + n * (n + 1) / 2 for
  // n tokens from `start` (the step's attention work; = context_tokens when all decode).
  int64_t attended_tokens = 0;
  // The part of attended_tokens of the items that are not single decode tokens.
  int64_t prompt_attended_tokens = 0;
  int64_t preempted = 0;
  double schedule_seconds = 0;  // scheduler work: picking the batch, then committing it
  double forward_seconds = 0;   // the model
  double total_seconds = 0;     // the whole step, sampling and callbacks included
};

class LocalEngine {
 public:
  struct Options {
    // Builds the backend that computes the steps, over the loaded model (which outlives it);
    // null: a CpuBackend with `cpu`.
    std::function<absl::StatusOr<std::unique_ptr<Backend>>(const LoadedModel& model)> backend =
        nullptr;
    CpuBackend::Options cpu;
    // KV blocks in the pool; 0: as many as kv_cache_bytes holds.
    int64_t kv_blocks = 0;
    int64_t kv_cache_bytes = int64_t{512} << 20;
    SchedulerOptions scheduler;
    bool enable_prefix_caching = true;
    // Input of every block hash; empty: the model file's name without its extension.
    std::string model_id;
    // Where the KV pool's memory comes from (a transport's); none: the backend's
    // (Backend::KvMemory: the heap for the CPU).
    KvAllocator kv_allocator = {};
  };

  ~LocalEngine();

  static absl::StatusOr<std::unique_ptr<LocalEngine>> Open(const std::string& model_path,
                                                           const Options& options);

  const ModelConfig& config() const { return model_.config; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  // The model's chat renderer (ChatTemplate::ForModel: its Jinja template, else a built-in one),
  // or the error that explains why it has none.
  const absl::StatusOr<ChatTemplate>& chat_template() const { return chat_template_; }
  int64_t kv_pool_bytes() const;

  // The prompt's token ids (BOS added as the model asks; special tokens in the text are parsed).
  std::vector<int32_t> EncodePrompt(absl::string_view text) const;
  // The chat rendered by the model's template, with the generation prompt, as token ids.
  // INVALID_ARGUMENT when the model has no usable template or the template refuses the chat
  // (its message).
  absl::StatusOr<std::vector<int32_t>> EncodeChat(const std::vector<ChatMessage>& messages) const;

  using DeltaCallback = std::function<void(const GenerationDelta&)>;

  // Queues a request; `on_delta` is called from Step with each new token, the last delta carrying
  // the finish reason. INVALID_ARGUMENT for an empty prompt, a token id outside the vocabulary, a
  // prompt plus max_tokens over the context, invalid sampling options or an id in use;
  // RESOURCE_EXHAUSTED when the whole KV pool could not hold the request at its longest. A request
  // without max_tokens generates until a stop condition or the end of the context.
  absl::Status Add(uint64_t id, GenerationRequest request, DeltaCallback on_delta);
  // Drops a request at once and frees its KV blocks (or holds them, GenerationRequest::hold_kv);
  // no further delta is sent. False for an unknown id.
  bool Cancel(uint64_t id);
  // Frees the blocks a hold_kv request kept when it ended. False when `id` holds none.
  bool ReleaseKv(uint64_t id);
  bool HasWork() const { return scheduler_->HasWork(); }
  // Disaggregated prefill, decode side: validates like Add and reserves the request's blocks
  // (after its cached prefix) for a peer to write the rest of the prompt's K/V into. The request
  // waits until CompleteRemotePrefill or FallBackToLocalPrefill. RESOURCE_EXHAUSTED (nothing
  // added) when the batch or the pool is full now; Add queues it instead.
  absl::StatusOr<RemotePrefillPlan> AddRemotePrefill(uint64_t id, GenerationRequest request,
                                                     DeltaCallback on_delta);
  // The peer wrote the prompt's K/V and sampled `first_token` from it (with its log-probabilities
  // when the request asked for them): the token is reported like any other (it may end the
  // request), and the request decodes here. INVALID_ARGUMENT for a token
  // outside the vocabulary (the request is then prefilled here instead); NOT_FOUND for an id that
  // is not waiting for a remote prefill.
  absl::Status CompleteRemotePrefill(uint64_t id, sampling::SampledToken first_token);
  // The peer failed: the request is prefilled here. NOT_FOUND as above.
  absl::Status FallBackToLocalPrefill(uint64_t id);

  // Runs one step of the batch. An error of the model (not of a request) ends every request of
  // the step with FinishReason::kError and is returned.
  absl::Status Step(StepInfo* info = nullptr);

  // Generates for all `requests` (batched as the scheduler sees fit) and calls `on_delta` for
  // every new token. Errors as Add, naming the request; nothing runs when any request is invalid.
  // REQUIRES: no other request is queued.
  absl::Status Generate(absl::Span<const GenerationRequest> requests,
                        const std::function<void(const GenerationDelta&)>& on_delta,
                        GenerationStats* stats = nullptr);

  SchedulerStats scheduler_stats() const { return scheduler_->stats(); }
  BlockPool& kv_pool() { return *pool_; }
  Backend& backend() { return *backend_; }
  const std::string& model_id() const { return model_id_; }

  // `format` compiled for this model's vocabulary (the compiler is made at the first constrained
  // request); compiled formats are kept, so compiling one again costs a lookup. INVALID_ARGUMENT
  // with the compiler's message, its param (common/status_conversion.h) "response_format", or
  // "tools" for a tool-call structural tag. Thread-safe: callers on other threads compile a request's format
  // before handing it to the stepping thread, so that a large schema never stalls a step.
  absl::StatusOr<grammar::CompiledFormat> CompileFormat(
      const sampling::ResponseFormat& format) const;

 private:
  struct Request;
  LocalEngine(LoadedModel model, const Options& options);
  absl::Status Validate(const GenerationRequest& request) const;
  // Samples the next token of `r` from `logits` and reports it; true when the request ended.
  absl::StatusOr<bool> Advance(Request& r, const float* logits);
  // Reports `next` as the request's new token; true when the request ended.
  absl::StatusOr<bool> Deliver(Request& r, sampling::SampledToken next);
  using RequestMap = absl::flat_hash_map<uint64_t, std::unique_ptr<Request>>;
  // Removes an ended request and finishes its sequence (holding its blocks when it asked).
  void End(RequestMap::iterator it);
  absl::StatusOr<std::unique_ptr<Request>> MakeRequest(uint64_t id, const GenerationRequest& request,
                                                       DeltaCallback on_delta) const;
  // How many tokens the request may add to its prompt.
  int64_t MaxNewTokens(const GenerationRequest& request) const;
  LoadedModel model_;
  Options options_;
  std::string model_id_;
  std::unique_ptr<Tokenizer> tokenizer_;
  absl::StatusOr<ChatTemplate> chat_template_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<BlockPool> pool_;
  std::unique_ptr<Scheduler> scheduler_;
  RequestMap requests_;
  std::vector<int32_t> eos_ids_;
  // Compiles response formats (and keeps them); made by whichever thread compiles first.
  mutable absl::Mutex formats_mu_;
  mutable std::unique_ptr<grammar::ResponseFormatCompiler> formats_ ABSL_GUARDED_BY(formats_mu_);
  StepOutput step_out_;  // reused by every step (a batch's logits are megabytes)
};

}  // namespace tandem

#endif  // TANDEM_ENGINE_RUNTIME_LOCAL_ENGINE_H_
