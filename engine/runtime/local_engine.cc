#include "engine/runtime/local_engine.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/tokenizer/gguf_tokenizer.h"
#include "engine/tokenizer/streaming_detokenizer.h"

namespace tandem {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int64_t BlocksFor(int64_t tokens, int64_t block_size) { return (tokens + block_size - 1) / block_size; }

// Tokens that end a generation besides the tokenizer's EOS, as llama.cpp counts them.
constexpr const char* kEndOfGenerationTokens[] = {"<|im_end|>", "<|eot_id|>", "<|end_of_text|>",
                                                  "<|endoftext|>", "</s>", "<|end|>"};

}  // namespace

LocalEngine::LocalEngine(LoadedModel model, const Options& options)
    : model_(std::move(model)),
      options_(options),
      chat_template_(absl::UnimplementedError("no chat template")) {}

absl::StatusOr<std::unique_ptr<LocalEngine>> LocalEngine::Open(const std::string& model_path,
                                                               const Options& options) {
  if (options.max_batch <= 0 || options.prefill_chunk <= 0 || options.kv_blocks < 0) {
    return absl::InvalidArgumentError("max_batch and prefill_chunk must be positive");
  }
  ASSIGN_OR_RETURN(LoadedModel model, LoadGgufModel(model_path));
  auto engine = std::unique_ptr<LocalEngine>(new LocalEngine(std::move(model), options));
  ASSIGN_OR_RETURN(engine->tokenizer_, TokenizerFromGguf(*engine->model_.file));
  if (engine->tokenizer_->vocab_size() != engine->model_.config.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        model_path, ": the tokenizer has ", engine->tokenizer_->vocab_size(),
        " tokens but the model's vocabulary is ", engine->model_.config.vocab_size));
  }
  const std::string& jinja = engine->tokenizer_->data().chat_template;
  if (!jinja.empty()) engine->chat_template_ = ChatTemplate::FromJinja(jinja);
  ASSIGN_OR_RETURN(engine->forward_, CpuForward::Create(&engine->model_, options.forward));
  int64_t blocks = options.kv_blocks;
  if (blocks == 0) {
    const int64_t context = std::min<int64_t>(engine->model_.config.max_context, 4096);
    blocks = options.max_batch * BlocksFor(context, options.forward.block_size);
  }
  ASSIGN_OR_RETURN(engine->kv_, KvStorage::Create(engine->forward_->KvLayoutFor(blocks)));
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
  return kv_->layout().total_floats() * static_cast<int64_t>(sizeof(float));
}

std::vector<int32_t> LocalEngine::EncodePrompt(absl::string_view text) const {
  return tokenizer_->Encode(text, {.add_special = true, .parse_special = true});
}

absl::StatusOr<std::vector<int32_t>> LocalEngine::EncodeChat(
    const std::vector<ChatMessage>& messages) const {
  RETURN_IF_ERROR(chat_template_.status());
  const int32_t bos = tokenizer_->bos_id();
  ASSIGN_OR_RETURN(
      std::string text,
      chat_template_->Render(messages, {.add_generation_prompt = true,
                                        .bos_token = bos >= 0 ? tokenizer_->TokenBytes(bos) : ""}));
  return tokenizer_->Encode(text, {.add_special = false, .parse_special = true});
}

absl::Status LocalEngine::Generate(absl::Span<const GenerationRequest> requests,
                                   const std::function<void(const GenerationDelta&)>& on_delta,
                                   GenerationStats* stats) {
  const ModelConfig& c = model_.config;
  const int64_t block_size = kv_->layout().block_size;
  if (static_cast<int64_t>(requests.size()) > options_.max_batch) {
    return absl::ResourceExhaustedError(absl::StrCat(requests.size(), " requests exceed max_batch ",
                                                     options_.max_batch));
  }

  // KV blocks a request reserves: its prompt plus max_tokens, or the whole context without one.
  auto blocks_for = [&](const GenerationRequest& r) {
    const int64_t prompt_len = static_cast<int64_t>(r.prompt.size());
    const int64_t total = r.sampling.max_tokens ? prompt_len + *r.sampling.max_tokens : c.max_context;
    return BlocksFor(std::min(total, c.max_context), block_size);
  };

  // Everything is checked before anything runs.
  struct Sequence {
    size_t index;
    std::vector<int32_t> tokens;  // prompt, then generated
    int64_t prompt_len;
    std::vector<int32_t> blocks;
    sampling::Sampler sampler;
    sampling::StopChecker stop;
    StreamingDetokenizer detokenizer;
    bool done = false;
  };
  std::vector<Sequence> seqs;
  int64_t blocks_needed = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const GenerationRequest& r = requests[i];
    auto invalid = [&](const absl::Status& s) { return Annotate(s, absl::StrCat("request ", i)); };
    if (r.prompt.empty()) return invalid(absl::InvalidArgumentError("the prompt is empty"));
    for (int32_t t : r.prompt) {
      if (t < 0 || t >= c.vocab_size) {
        return invalid(absl::InvalidArgumentError(
            absl::StrCat("prompt token id ", t, " is outside the vocabulary [0, ", c.vocab_size, ")")));
      }
    }
    const int64_t prompt_len = static_cast<int64_t>(r.prompt.size());
    if (prompt_len >= c.max_context) {
      return invalid(absl::InvalidArgumentError(absl::StrCat(
          "the prompt has ", prompt_len, " tokens; the context holds ", c.max_context,
          " including at least one generated token")));
    }
    if (absl::Status s = sampling::ValidateSamplingOptions(r.sampling, c.vocab_size,
                                                           static_cast<int>(c.max_context));
        !s.ok()) {
      return invalid(s);
    }
    if (absl::Status s = sampling::ValidatePromptLength(r.sampling, prompt_len,
                                                        static_cast<int>(c.max_context));
        !s.ok()) {
      return invalid(s);
    }
    blocks_needed += blocks_for(r);
  }
  if (blocks_needed > kv_->num_free_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat("the requests need ", blocks_needed,
                                                     " KV blocks; the pool has ",
                                                     kv_->num_free_blocks(), " free"));
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    const GenerationRequest& r = requests[i];
    const int64_t prompt_len = static_cast<int64_t>(r.prompt.size());
    ASSIGN_OR_RETURN(sampling::Sampler sampler,
                     sampling::Sampler::Create(r.sampling, {.vocab_size = static_cast<int>(c.vocab_size),
                                                            .eos_token_ids = eos_ids_,
                                                            .prompt_tokens = r.prompt}));
    ASSIGN_OR_RETURN(sampling::StopChecker stop,
                     sampling::StopChecker::Create(r.sampling, {.eos_token_ids = eos_ids_,
                                                                .prompt_tokens = prompt_len,
                                                                .max_context = c.max_context}));
    ASSIGN_OR_RETURN(std::vector<int32_t> blocks, kv_->Allocate(blocks_for(r)));
    seqs.push_back(Sequence{i, r.prompt, prompt_len, std::move(blocks), std::move(sampler),
                            std::move(stop), StreamingDetokenizer(*tokenizer_)});
  }
  // Blocks go back to the pool however this function returns.
  struct Release {
    KvStorage* kv;
    std::vector<Sequence>* seqs;
    ~Release() {
      for (Sequence& s : *seqs) kv->Free(s.blocks);
    }
  } release{kv_.get(), &seqs};

  GenerationStats local_stats;
  GenerationStats& st = stats != nullptr ? *stats : local_stats;
  st = GenerationStats{};

  // Samples the next token of `s` from `logits`, reports it, and marks the sequence done when it
  // stops.
  auto advance = [&](Sequence& s, const float* logits) -> absl::Status {
    ASSIGN_OR_RETURN(sampling::SampledToken next,
                     s.sampler.Sample(absl::MakeConstSpan(logits, static_cast<size_t>(c.vocab_size))));
    RETURN_IF_ERROR(s.sampler.Accept(next.id));
    s.tokens.push_back(next.id);
    ++st.generated_tokens;
    const std::string piece = s.detokenizer.Add(next.id);
    sampling::StopStep step = s.stop.Append(next.id, piece);
    GenerationDelta delta{.index = s.index, .token = next.id, .text = std::move(step.text),
                          .logprob = next.logprob, .top_logprobs = std::move(next.top_logprobs),
                          .finish = step.finish};
    if (step.finish != sampling::FinishReason::kNone) {
      s.done = true;
      // Bytes the detokenizer still holds (an unfinished character) end the text.
      if (step.finish != sampling::FinishReason::kStop &&
          step.finish != sampling::FinishReason::kStopString) {
        delta.text += s.detokenizer.Finish();
      }
    }
    on_delta(delta);
    return absl::OkStatus();
  };

  // Prefill: every prompt, in chunks; the last chunk of each yields its first token.
  StepOutput out;
  const auto prefill_start = std::chrono::steady_clock::now();
  for (Sequence& s : seqs) {
    st.prompt_tokens += s.prompt_len;
    for (int64_t start = 0; start < s.prompt_len; start += options_.prefill_chunk) {
      const int64_t n = std::min(options_.prefill_chunk, s.prompt_len - start);
      StepBatch batch;
      batch.sequences.push_back(StepSequence{
          .tokens = absl::MakeConstSpan(s.tokens).subspan(static_cast<size_t>(start),
                                                          static_cast<size_t>(n)),
          .start_position = start,
          .block_table = s.blocks,
          .compute_logits = start + n == s.prompt_len});
      RETURN_IF_ERROR(forward_->Step(batch, kv_.get(), &out));
    }
    RETURN_IF_ERROR(advance(s, out.Logits(0)));
  }
  st.prefill_seconds = SecondsSince(prefill_start);

  // Decode: one token of every running sequence per step.
  const auto decode_start = std::chrono::steady_clock::now();
  while (true) {
    StepBatch batch;
    std::vector<Sequence*> running;
    for (Sequence& s : seqs) {
      if (s.done) continue;
      running.push_back(&s);
      batch.sequences.push_back(StepSequence{
          .tokens = absl::MakeConstSpan(s.tokens).last(1),
          .start_position = static_cast<int64_t>(s.tokens.size()) - 1,
          .block_table = s.blocks});
    }
    if (running.empty()) break;
    RETURN_IF_ERROR(forward_->Step(batch, kv_.get(), &out));
    ++st.decode_steps;
    for (size_t i = 0; i < running.size(); ++i) {
      RETURN_IF_ERROR(advance(*running[i], out.Logits(static_cast<int64_t>(i))));
    }
  }
  st.decode_seconds = SecondsSince(decode_start);
  return absl::OkStatus();
}

}  // namespace tandem
