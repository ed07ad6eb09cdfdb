#include "engine/runtime/local_engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/status_conversion.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "engine/tokenizer/gguf_tokenizer.h"
#include "engine/tokenizer/hf_tokenizer.h"
#include "engine/tokenizer/streaming_detokenizer.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Tokens that end a generation besides the tokenizer's EOS, as llama.cpp counts them.
constexpr const char* kEndOfGenerationTokens[] = {"<|im_end|>", "<|eot_id|>", "<|end_of_text|>",
                                                  "<|endoftext|>", "</s>", "<|end|>"};

// `token`'s log-probability under log_softmax(logits), in double, with the `k` most likely
// tokens, most likely first (equal logits by lower id), as the sampler reports a sampled token's.
sampling::SampledToken ScoreToken(absl::Span<const float> logits, int32_t token, int k) {
  float mx = -std::numeric_limits<float>::infinity();
  for (float x : logits) mx = std::max(mx, x);
  double z = 0;
  for (float x : logits) z += std::exp(static_cast<double>(x - mx));
  const double log_z = static_cast<double>(mx) + std::log(z);
  sampling::SampledToken out{.id = token,
                             .logprob = static_cast<float>(logits[static_cast<size_t>(token)] - log_z),
                             .top_logprobs = {}};
  std::vector<sampling::TokenLogprob>& top = out.top_logprobs;
  top.reserve(static_cast<size_t>(k) + 1);
  for (size_t i = 0; i < logits.size(); ++i) {
    const float x = logits[i];
    if (top.size() == static_cast<size_t>(k) && !(x > top.back().logprob)) continue;
    auto pos = std::upper_bound(top.begin(), top.end(), x,
                                [](float v, const sampling::TokenLogprob& t) { return v > t.logprob; });
    top.insert(pos, {static_cast<int32_t>(i), x});
    if (top.size() > static_cast<size_t>(k)) top.pop_back();
  }
  for (sampling::TokenLogprob& t : top) t.logprob = static_cast<float>(t.logprob - log_z);
  return out;
}

}  // namespace

struct LocalEngine::Request {
  uint64_t id;
  sampling::Sampler sampler;
  sampling::StopChecker stop;
  StreamingDetokenizer detokenizer;
  DeltaCallback on_delta;
  std::function<void(const KvLayerDone&)> on_kv_layer;
  // The response_format's state; none when the output is unconstrained.
  std::optional<grammar::TokenConstraint> constraint = std::nullopt;
  bool remote = false;  // waiting for a peer's prefill
  bool hold_kv = false;  // GenerationRequest::hold_kv
  bool reported_first = false;  // its first delta went out
  // GenerationRequest::prompt_logprobs, and the prompt's scores so far: entry p for prompt token
  // p + 1 (filled chunk by chunk; a recomputed chunk overwrites).
  int prompt_logprobs = 0;
  std::vector<sampling::SampledToken> prompt_scores = {};
  // Start of the first step that computed any of its prompt tokens here.
  std::optional<Clock::time_point> first_prompt_step = std::nullopt;
};

LocalEngine::LocalEngine(LoadedModel model, const Options& options)
    : model_(std::move(model)),
      options_(options),
      chat_template_(absl::UnimplementedError("no chat template")) {}

LocalEngine::~LocalEngine() = default;

absl::StatusOr<std::unique_ptr<LocalEngine>> LocalEngine::Open(const std::string& model_path,
                                                               const Options& options) {
  const SchedulerOptions& so = options.scheduler;
  if (so.max_running <= 0 || so.max_tokens_per_step <= 0 || so.max_prefill_chunk < 0 ||
      so.max_prefill_tokens < 0 ||
      so.admission_reserve_blocks < 0 || options.kv_blocks < 0 || options.kv_cache_bytes <= 0) {
    return absl::InvalidArgumentError(
        "max_running, max_tokens_per_step and kv_cache_bytes must be positive; max_prefill_chunk, "
        "max_prefill_tokens, admission_reserve_blocks and kv_blocks must not be negative");
  }
  ASSIGN_OR_RETURN(LoadedModel model, LoadModel(model_path));
  auto engine = std::unique_ptr<LocalEngine>(new LocalEngine(std::move(model), options));
  engine->model_id_ = options.model_id.empty()
                          ? std::filesystem::path(model_path).stem().string()
                          : options.model_id;
  if (engine->model_.file != nullptr) {
    ASSIGN_OR_RETURN(engine->tokenizer_, TokenizerFromGguf(*engine->model_.file));
  } else {  // a Hugging Face folder
    ASSIGN_OR_RETURN(engine->tokenizer_, TokenizerFromHfFolder(model_path));
  }
  if (engine->tokenizer_->vocab_size() != engine->model_.config.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        model_path, ": the tokenizer has ", engine->tokenizer_->vocab_size(),
        " tokens but the model's vocabulary is ", engine->model_.config.vocab_size));
  }
  engine->chat_template_ = ChatTemplate::ForModel(*engine->tokenizer_);
  if (!engine->chat_template_.ok()) {
    LOG(WARNING) << model_path << ": chat requests will be refused: "
                 << engine->chat_template_.status().message();
  }
  if (options.backend != nullptr) {
    ASSIGN_OR_RETURN(engine->backend_, options.backend(engine->model_));
  } else {
    ASSIGN_OR_RETURN(engine->backend_, CpuBackend::Create(&engine->model_, options.cpu));
  }
  int64_t blocks = options.kv_blocks;
  if (blocks == 0) {
    const int64_t block_bytes = engine->backend_->KvLayoutFor(1).block_stride_bytes();
    blocks = options.kv_cache_bytes / block_bytes;
    if (blocks == 0) {
      return absl::InvalidArgumentError(absl::StrCat("kv_cache_bytes ", options.kv_cache_bytes,
                                                     " holds no KV block of ", block_bytes,
                                                     " bytes"));
    }
  }
  ASSIGN_OR_RETURN(engine->pool_,
                   BlockPool::Create(engine->backend_->KvLayoutFor(blocks),
                                     {.model_id = engine->model_id_,
                                      .enable_prefix_caching = options.enable_prefix_caching,
                                      .allocator = options.kv_allocator.allocate != nullptr
                                                       ? options.kv_allocator
                                                       : engine->backend_->KvMemory()}));
  engine->scheduler_ = std::make_unique<Scheduler>(engine->pool_.get(), options.scheduler);
  const int32_t eos = engine->tokenizer_->eos_id();
  if (eos >= 0) engine->eos_ids_.push_back(eos);
  for (const char* text : kEndOfGenerationTokens) {
    const int32_t id = engine->tokenizer_->TokenToId(text);
    if (id >= 0 && std::find(engine->eos_ids_.begin(), engine->eos_ids_.end(), id) ==
                       engine->eos_ids_.end()) {
      engine->eos_ids_.push_back(id);
    }
  }
  return engine;
}

int64_t LocalEngine::kv_pool_bytes() const {
  return pool_->layout().total_bytes();
}

std::vector<int32_t> LocalEngine::EncodePrompt(absl::string_view text) const {
  return tokenizer_->Encode(text, {.add_special = true, .parse_special = true});
}

absl::StatusOr<std::vector<int32_t>> LocalEngine::EncodeChat(
    const std::vector<ChatMessage>& messages) const {
  if (!chat_template_.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("the model has no usable chat template: ",
                                                   chat_template_.status().message()));
  }
  ASSIGN_OR_RETURN(std::string text,
                   chat_template_->Render(messages, ChatTemplate::OptionsFor(*tokenizer_)));
  return tokenizer_->Encode(text, {.add_special = false, .parse_special = true});
}

absl::Status LocalEngine::Validate(const GenerationRequest& r) const {
  const ModelConfig& c = model_.config;
  if (r.prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  for (int32_t t : r.prompt) {
    if (t < 0 || t >= c.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt token id ", t, " is outside the vocabulary [0, ", c.vocab_size, ")"));
    }
  }
  const int64_t prompt_len = static_cast<int64_t>(r.prompt.size());
  if (r.prior_output_tokens < 0 || r.prior_output_tokens >= prompt_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prior_output_tokens must be in [0, ", prompt_len, "), got ", r.prior_output_tokens));
  }
  if (prompt_len >= c.max_context) {
    return absl::InvalidArgumentError(
        absl::StrCat("the prompt has ", prompt_len, " tokens; the context holds ", c.max_context,
                     " including at least one generated token"));
  }
  RETURN_IF_ERROR(
      sampling::ValidateSamplingOptions(r.sampling, c.vocab_size, static_cast<int>(c.max_context)));
  RETURN_IF_ERROR(sampling::ValidatePromptLength(r.sampling, prompt_len - r.prior_output_tokens,
                                                 static_cast<int>(c.max_context)));
  if (r.prompt_logprobs < 0 || r.prompt_logprobs > sampling::kMaxLogprobs) {
    return absl::InvalidArgumentError(absl::StrCat("prompt_logprobs must be in [0, ",
                                                   sampling::kMaxLogprobs, "], got ",
                                                   r.prompt_logprobs));
  }
  if (r.prompt_logprobs > 0 && r.prior_output_tokens > 0) {
    return absl::InvalidArgumentError(
        "prompt_logprobs with prior output tokens: the prompt was scored where it started");
  }
  if (r.sampling.response_format.constrained()) {
    RETURN_IF_ERROR(CompileFormat(r.sampling.response_format).status());
  }
  if (MaxNewTokens(r) <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", r.prior_output_tokens, " prior output tokens already reach max_tokens"));
  }
  // The pool must hold the request at its longest, or it could never finish.
  const int64_t longest = prompt_len + MaxNewTokens(r);
  const int64_t bs = pool_->block_size();
  if ((longest + bs - 1) / bs > pool_->num_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the request may grow to ", longest, " tokens; the KV pool holds ",
        pool_->num_blocks() * bs, " (set max_tokens lower or give the pool more memory)"));
  }
  return absl::OkStatus();
}

absl::Status LocalEngine::Add(uint64_t id, GenerationRequest request, DeltaCallback on_delta) {
  RETURN_IF_ERROR(Validate(request));
  if (requests_.contains(id)) {
    return absl::InvalidArgumentError(absl::StrCat("request id ", id, " is in use"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Request> r, MakeRequest(id, request, std::move(on_delta)));
  RETURN_IF_ERROR(scheduler_->Add(id, std::move(request.prompt), MaxNewTokens(request),
                                  request.priority,
                                  /*reuse_prefix=*/request.prompt_logprobs == 0));
  requests_.emplace(id, std::move(r));
  return absl::OkStatus();
}

absl::StatusOr<RemotePrefillPlan> LocalEngine::AddRemotePrefill(uint64_t id,
                                                                GenerationRequest request,
                                                                DeltaCallback on_delta) {
  RETURN_IF_ERROR(Validate(request));
  if (request.prompt_logprobs > 0) {
    return absl::InvalidArgumentError("prompt_logprobs needs the prompt computed here");
  }
  if (requests_.contains(id)) {
    return absl::InvalidArgumentError(absl::StrCat("request id ", id, " is in use"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Request> r, MakeRequest(id, request, std::move(on_delta)));
  ASSIGN_OR_RETURN(RemotePrefillPlan plan,
                   scheduler_->AddRemotePrefill(id, std::move(request.prompt),
                                                MaxNewTokens(request), request.priority));
  r->remote = true;
  requests_.emplace(id, std::move(r));
  return plan;
}

absl::Status LocalEngine::CompleteRemotePrefill(uint64_t id, sampling::SampledToken first_token) {
  auto it = requests_.find(id);
  if (it == requests_.end() || !it->second->remote) {
    return absl::NotFoundError(absl::StrCat("request ", id, " waits for no remote prefill"));
  }
  Request& r = *it->second;
  if (first_token.id < 0 || first_token.id >= model_.config.vocab_size) {
    r.remote = false;
    scheduler_->FallBackToLocalPrefill(id);
    return absl::InvalidArgumentError(absl::StrCat("the peer's first token ", first_token.id,
                                                   " is outside the vocabulary"));
  }
  if (r.constraint.has_value()) {
    // The peer applied the same response_format; a token it does not allow is the peer's fault.
    const absl::Span<const uint32_t> allowed = r.constraint->AllowedTokens();
    const auto t = static_cast<uint32_t>(first_token.id);
    if (!allowed.empty() && (allowed[t / 32] >> (t % 32) & 1u) == 0) {
      r.remote = false;
      scheduler_->FallBackToLocalPrefill(id);
      return absl::InvalidArgumentError(absl::StrCat(
          "the peer's first token ", first_token.id, " does not fit the response_format"));
    }
  }
  r.remote = false;
  scheduler_->CompleteRemotePrefill(id);
  absl::StatusOr<bool> done = Deliver(r, std::move(first_token));
  if (!done.ok() || *done) {
    End(it);
  }
  return done.status();
}

absl::Status LocalEngine::FallBackToLocalPrefill(uint64_t id) {
  auto it = requests_.find(id);
  if (it == requests_.end() || !it->second->remote) {
    return absl::NotFoundError(absl::StrCat("request ", id, " waits for no remote prefill"));
  }
  it->second->remote = false;
  scheduler_->FallBackToLocalPrefill(id);
  return absl::OkStatus();
}

int64_t LocalEngine::MaxNewTokens(const GenerationRequest& request) const {
  const int64_t context = model_.config.max_context;
  const int64_t prompt_len = static_cast<int64_t>(request.prompt.size());
  // max_tokens counts the prior output tokens too.
  const int64_t original_prompt = prompt_len - request.prior_output_tokens;
  return std::min<int64_t>(context,
                           original_prompt + request.sampling.max_tokens.value_or(context)) -
         prompt_len;
}

absl::StatusOr<grammar::CompiledFormat> LocalEngine::CompileFormat(
    const sampling::ResponseFormat& format) const {
  grammar::ResponseFormatCompiler* compiler;
  {
    absl::MutexLock lock(&formats_mu_);
    if (formats_ == nullptr) {
      // What each token adds to the output text; control tokens and ids past the tokenizer's
      // vocabulary add nothing and are never allowed.
      grammar::GrammarVocabulary vocabulary;
      vocabulary.stop_token_ids = eos_ids_;
      vocabulary.token_bytes.resize(static_cast<size_t>(model_.config.vocab_size));
      for (int32_t id = 0; id < tokenizer_->vocab_size() && id < model_.config.vocab_size; ++id) {
        vocabulary.token_bytes[static_cast<size_t>(id)] =
            tokenizer_->TokenBytes(id, {.skip_special = true});
      }
      ASSIGN_OR_RETURN(formats_, grammar::ResponseFormatCompiler::Create(vocabulary));
    }
    compiler = formats_.get();
  }
  // Thread-safe, outside the lock: compiles run in parallel.
  absl::StatusOr<grammar::CompiledFormat> compiled = compiler->Compile(format);
  if (compiled.ok()) return compiled;
  // The request field at fault (the API's param): a tool-call grammar comes from the tools.
  return WithParam(compiled.status(),
                   format.kind == sampling::ResponseFormat::Kind::kStructuralTag
                       ? "tools"
                       : "response_format");
}

absl::StatusOr<std::unique_ptr<LocalEngine::Request>> LocalEngine::MakeRequest(
    uint64_t id, const GenerationRequest& request, DeltaCallback on_delta) const {
  const ModelConfig& c = model_.config;
  const int64_t original_prompt =
      static_cast<int64_t>(request.prompt.size()) - request.prior_output_tokens;
  const absl::Span<const int32_t> prompt(request.prompt);
  ASSIGN_OR_RETURN(sampling::Sampler sampler,
                   sampling::Sampler::Create(
                       request.sampling, {.vocab_size = static_cast<int>(c.vocab_size),
                                          .eos_token_ids = eos_ids_,
                                          .prompt_tokens = prompt.first(original_prompt)}));
  ASSIGN_OR_RETURN(sampling::StopChecker stop,
                   sampling::StopChecker::Create(request.sampling,
                                                 {.eos_token_ids = eos_ids_,
                                                  .prompt_tokens = original_prompt,
                                                  .max_context = c.max_context}));
  auto r = std::make_unique<Request>(Request{id, std::move(sampler), std::move(stop),
                                             StreamingDetokenizer(*tokenizer_), std::move(on_delta),
                                             request.on_kv_layer});
  r->hold_kv = request.hold_kv;
  r->prompt_logprobs = request.prompt_logprobs;
  if (r->prompt_logprobs > 0) r->prompt_scores.resize(request.prompt.size() - 1);
  if (request.sampling.response_format.constrained()) {
    ASSIGN_OR_RETURN(grammar::CompiledFormat format, CompileFormat(request.sampling.response_format));
    r->constraint.emplace(format);
  }
  // Replay the output generated elsewhere; its text was emitted there. The grammar's state is
  // rebuilt from the same tokens.
  for (int32_t token : prompt.subspan(original_prompt)) {
    RETURN_IF_ERROR(r->sampler.Accept(token));
    if (r->constraint.has_value()) {
      if (absl::Status s = r->constraint->Accept(token); !s.ok()) {
        return Annotate(s, "a prior output token does not fit the response_format");
      }
      if (r->constraint->Terminated()) {
        return absl::InvalidArgumentError(
            "the prior output tokens already complete the response_format");
      }
    }
    const sampling::StopStep step = r->stop.Append(token, r->detokenizer.Add(token));
    if (step.finish != sampling::FinishReason::kNone) {
      return absl::InvalidArgumentError(
          absl::StrCat("the prior output tokens already end the request (",
                       sampling::FinishReasonName(step.finish), ")"));
    }
  }
  return r;
}

bool LocalEngine::Cancel(uint64_t id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return false;
  End(it);
  return true;
}

void LocalEngine::End(RequestMap::iterator it) {
  const uint64_t id = it->first;
  const bool hold = it->second->hold_kv;
  requests_.erase(it);
  CHECK(hold ? scheduler_->FinishAndHold(id) : scheduler_->Finish(id)) << "request " << id;
}

bool LocalEngine::ReleaseKv(uint64_t id) { return scheduler_->ReleaseHeld(id); }

absl::StatusOr<bool> LocalEngine::Advance(Request& r, const float* logits) {
  const ModelConfig& c = model_.config;
  const absl::Span<const uint32_t> allowed =
      r.constraint.has_value() ? r.constraint->AllowedTokens() : absl::Span<const uint32_t>();
  ASSIGN_OR_RETURN(sampling::SampledToken next,
                   r.sampler.Sample(absl::MakeConstSpan(logits, static_cast<size_t>(c.vocab_size)),
                                    allowed));
  return Deliver(r, std::move(next));
}

absl::StatusOr<bool> LocalEngine::Deliver(Request& r, sampling::SampledToken next) {
  RETURN_IF_ERROR(r.sampler.Accept(next.id));
  if (r.constraint.has_value()) RETURN_IF_ERROR(r.constraint->Accept(next.id));
  const std::string piece = r.detokenizer.Add(next.id);
  sampling::StopStep step = r.stop.Append(next.id, piece);
  // The grammar ended with a stop token (which ends the request anyway unless ignore_eos).
  if (r.constraint.has_value() && r.constraint->Terminated() &&
      step.finish == sampling::FinishReason::kNone) {
    step.finish = sampling::FinishReason::kStop;
  }
  GenerationDelta delta{.index = r.id, .token = next.id, .text = std::move(step.text),
                        .logprob = next.logprob, .top_logprobs = std::move(next.top_logprobs),
                        .finish = step.finish};
  if (!r.reported_first) {
    delta.cached_prompt_tokens = scheduler_->cached_prompt_tokens(r.id);
    delta.prompt_logprobs = std::move(r.prompt_scores);
    if (r.first_prompt_step.has_value()) delta.prompt_seconds = SecondsSince(*r.first_prompt_step);
    r.reported_first = true;
  }
  const bool done = step.finish != sampling::FinishReason::kNone;
  // Bytes the detokenizer still holds (an unfinished character) end the text.
  if (done && step.finish != sampling::FinishReason::kStop &&
      step.finish != sampling::FinishReason::kStopString) {
    delta.text += r.detokenizer.Finish();
  }
  if (!done) scheduler_->AppendToken(r.id, next.id);
  r.on_delta(delta);
  return done;
}

absl::Status LocalEngine::Step(StepInfo* info) {
  const auto start = Clock::now();
  StepInfo local;
  StepInfo& in = info != nullptr ? *info : local;
  in = StepInfo{};
  ScheduledStep step = scheduler_->Schedule();
  in.schedule_seconds = SecondsSince(start);
  in.batch_size = static_cast<int64_t>(step.items.size());
  in.prefill_tokens = step.num_prefill_tokens;
  in.decode_tokens = step.num_decode_tokens;
  in.preempted = static_cast<int64_t>(step.preempted.size());
  if (step.items.empty()) {
    in.total_seconds = SecondsSince(start);
    return absl::OkStatus();
  }
  StepBatch batch;
  batch.sequences.reserve(step.items.size());
  // Per item: whether it scores its prompt (logits at every token).
  std::vector<bool> scores(step.items.size(), false);
  for (size_t i = 0; i < step.items.size(); ++i) {
    const ScheduledItem& item = step.items[i];
    if (!item.is_decode) {
      auto it = requests_.find(item.id);
      scores[i] = it != requests_.end() && it->second->prompt_logprobs > 0 &&
                  !it->second->reported_first;
    }
    batch.sequences.push_back(StepSequence{.tokens = item.tokens,
                                           .start_position = item.start,
                                           .block_table = item.block_table,
                                           .compute_logits = item.samples,
                                           .all_logits = scores[i]});
    const int64_t n = static_cast<int64_t>(item.tokens.size());
    in.context_tokens += item.start + n;
    const int64_t attended = n * item.start + n * (n + 1) / 2;
    in.attended_tokens += attended;
    if (!item.is_decode) in.prompt_attended_tokens += attended;
  }
  // Per-request layer hooks (a prefill worker's transfers), and when each prompt started.
  std::vector<std::pair<const ScheduledItem*, Request*>> hooked;
  for (const ScheduledItem& item : step.items) {
    auto it = requests_.find(item.id);
    if (it == requests_.end()) continue;
    Request& r = *it->second;
    if (!item.is_decode && !r.first_prompt_step.has_value()) r.first_prompt_step = start;
    if (r.on_kv_layer) hooked.emplace_back(&item, &r);
  }
  if (!hooked.empty()) {
    batch.on_layer_done = [&hooked](int64_t layer) {
      for (const auto& [item, request] : hooked) {
        request->on_kv_layer(KvLayerDone{.layer = layer,
                                         .first_position = item->start,
                                         .num_tokens = static_cast<int64_t>(item->tokens.size()),
                                         .block_table = item->block_table});
      }
    };
  }
  StepOutput& out = step_out_;
  const auto forward_start = Clock::now();
  const absl::Status forward = backend_->Step(batch, &pool_->storage(), &out);
  in.forward_seconds = SecondsSince(forward_start);
  if (!forward.ok()) {
    // Nothing of this step can be trusted: end its requests.
    for (const ScheduledItem& item : step.items) {
      auto it = requests_.find(item.id);
      if (it == requests_.end()) continue;
      it->second->on_delta(GenerationDelta{.index = item.id, .token = -1,
                                           .finish = sampling::FinishReason::kError});
      End(it);
    }
    return Annotate(forward, "engine step");
  }
  const auto commit_start = Clock::now();
  scheduler_->Commit(step);
  in.schedule_seconds += SecondsSince(commit_start);
  int64_t row = 0;
  absl::Status first_error;
  for (size_t i = 0; i < step.items.size(); ++i) {
    const ScheduledItem& item = step.items[i];
    if (scores[i]) {
      // Row j predicts the token at item.start + j + 1; the last row of the prompt's last chunk
      // is the one sampled from below.
      Request& r = *requests_.at(item.id);
      const auto n = static_cast<int64_t>(item.tokens.size());
      const auto scored = static_cast<int64_t>(r.prompt_scores.size());
      const absl::Span<const int32_t> tokens = scheduler_->tokens(item.id);
      for (int64_t j = 0; j < n; ++j) {
        const int64_t p = item.start + j;
        if (p < scored) {
          r.prompt_scores[static_cast<size_t>(p)] =
              ScoreToken(absl::MakeConstSpan(out.Logits(row + j),
                                             static_cast<size_t>(model_.config.vocab_size)),
                         tokens[static_cast<size_t>(p + 1)], r.prompt_logprobs);
        }
      }
      row += n - 1;  // the last row is the item's own, taken below when it samples
      if (!item.samples) {
        ++row;
        continue;
      }
    }
    if (!item.samples) continue;
    const float* logits = out.Logits(row++);
    auto it = requests_.find(item.id);
    CHECK(it != requests_.end()) << "scheduled request " << item.id << " is unknown";
    absl::StatusOr<bool> done = Advance(*it->second, logits);
    if (!done.ok()) {
      it->second->on_delta(GenerationDelta{.index = item.id, .token = -1,
                                           .finish = sampling::FinishReason::kError});
      first_error.Update(Annotate(done.status(), absl::StrCat("request ", item.id)));
    }
    if (!done.ok() || *done) {
      End(it);
    }
  }
  in.total_seconds = SecondsSince(start);
  return first_error;
}

absl::Status LocalEngine::Generate(absl::Span<const GenerationRequest> requests,
                                   const std::function<void(const GenerationDelta&)>& on_delta,
                                   GenerationStats* stats) {
  CHECK(!HasWork()) << "Generate while other requests are queued";
  // Everything is checked before anything runs.
  for (size_t i = 0; i < requests.size(); ++i) {
    if (absl::Status s = Validate(requests[i]); !s.ok()) {
      return Annotate(s, absl::StrCat("request ", i));
    }
  }
  GenerationStats local_stats;
  GenerationStats& st = stats != nullptr ? *stats : local_stats;
  st = GenerationStats{};
  for (size_t i = 0; i < requests.size(); ++i) {
    st.prompt_tokens += static_cast<int64_t>(requests[i].prompt.size());
    absl::Status s = Add(i, requests[i], [&](const GenerationDelta& d) {
      ++st.generated_tokens;
      on_delta(d);
    });
    if (!s.ok()) {
      for (size_t j = 0; j < i; ++j) Cancel(j);
      return Annotate(s, absl::StrCat("request ", i));
    }
  }
  while (HasWork()) {
    StepInfo info;
    const absl::Status s = Step(&info);
    if (!s.ok()) {
      for (size_t j = 0; j < requests.size(); ++j) Cancel(j);
      return s;
    }
    if (info.prefill_tokens > 0) {
      st.prefill_seconds += info.total_seconds;
    } else {
      st.decode_seconds += info.total_seconds;
      ++st.decode_steps;
      st.decode_tokens += info.decode_tokens;
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem
