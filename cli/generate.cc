#include "cli/generate.h"

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/status_conversion.h"
#include "common/tls_flags.h"
#include "engine/runtime/local_engine.h"
#include "grpcpp/create_channel.h"
#include "nlohmann/json.hpp"
#include "tandem/v1/inference.grpc.pb.h"

ABSL_FLAG(std::string, prompt, "", "Prompt text (generate)");
ABSL_FLAG(bool, chat, false, "Treat --prompt as a user message and apply the model's chat template");
ABSL_FLAG(std::string, system, "", "System message with --chat (default: the template's)");
ABSL_FLAG(int64_t, max_tokens, 128, "Most tokens to generate");
ABSL_FLAG(std::string, kv_dtype, "f16", "KV cache element type (generate): f16 or f32");
ABSL_FLAG(double, temperature, 0.0, "Sampling temperature; 0 is greedy");
ABSL_FLAG(double, top_p, 1.0, "Nucleus sampling mass in (0, 1]");
ABSL_FLAG(int32_t, top_k, 0, "Sample among the k most likely tokens; 0 is off");
ABSL_FLAG(double, min_p, 0.0, "Drop tokens below min_p times the top probability");
ABSL_FLAG(double, repetition_penalty, 1.0, "Repetition penalty (1 is off)");
ABSL_FLAG(int64_t, seed, -1, "Random seed; the same seed gives the same text. -1 picks one");
ABSL_FLAG(std::vector<std::string>, stop, {}, "Comma-separated stop strings");
ABSL_FLAG(int32_t, threads, 0, "Compute threads; 0 uses every core");
ABSL_FLAG(std::string, url, "",
          "A cluster's gRPC API (host:port or grpc://host:port, as `tandem up` prints it): "
          "generate there instead of in this process");
ABSL_FLAG(std::string, api_key, "",
          "With --url: the API key sent to a router with --api_keys_file (the `authorization` "
          "metadata, Bearer); empty: $OPENAI_API_KEY when set. Prefer the environment "
          "(TANDEM_API_KEY) to this flag, which other users of the machine can see in `ps`");
ABSL_FLAG(int32_t, priority, 0, "Scheduling priority of the request with --url (higher first)");
ABSL_FLAG(std::string, prompt_ids, "",
          "The prompt as comma-separated token ids, used as given (no BOS added), instead of "
          "--prompt (generate in this process)");
ABSL_FLAG(int32_t, logprobs, 0,
          "With --json: the log-probability of every generated token and this many most likely "
          "alternatives, 0-20");
ABSL_FLAG(int32_t, prompt_logprobs, 0,
          "With --json: the log-probability of every prompt token after the first given the "
          "tokens before it, and this many most likely alternatives, 0-20");
ABSL_FLAG(bool, json, false,
          "Print one JSON object when done (token ids, text, finish reason, log-probabilities) "
          "instead of streaming the text (generate in this process)");

namespace tandem {
namespace {

int ExitCode(const absl::Status& status) {
  std::fprintf(stderr, "\nerror: %s\n", status.ToString().c_str());
  return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

int ExitCode(const grpc::Status& status) {
  std::fprintf(stderr, "\nerror: %s\n", status.error_message().c_str());
  return status.error_code() == grpc::StatusCode::INVALID_ARGUMENT ? 2 : 1;
}

// The router's address from --url; INVALID_ARGUMENT for an HTTP URL (that is the OpenAI API).
absl::StatusOr<std::string> GrpcTarget(absl::string_view url) {
  if (absl::StartsWith(url, "http://") || absl::StartsWith(url, "https://")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--url=", url, " is an HTTP URL; give the cluster's gRPC API (host:port, the \"gRPC API\" "
        "line of `tandem up`), or use the OpenAI HTTP API with curl or an OpenAI client"));
  }
  absl::ConsumePrefix(&url, "grpc://");
  if (url.empty() || !absl::StrContains(url, ':')) {
    return absl::InvalidArgumentError(absl::StrCat("--url must be host:port, got '", url, "'"));
  }
  return std::string(url);
}

// The key for --url: --api_key (or TANDEM_API_KEY), else $OPENAI_API_KEY; empty for none.
// INVALID_ARGUMENT, without the key's text, for one that cannot travel as gRPC metadata.
absl::StatusOr<std::string> ApiKey() {
  std::string key = absl::GetFlag(FLAGS_api_key);
  absl::string_view source = "--api_key (or TANDEM_API_KEY)";
  if (key.empty()) {
    const char* openai = std::getenv("OPENAI_API_KEY");
    if (openai != nullptr) key = openai;
    source = "OPENAI_API_KEY";
  }
  for (const char c : key) {
    // A metadata value is printable ASCII; a space would split "Bearer <key>" differently.
    if (c <= ' ' || c > '~') {
      return absl::InvalidArgumentError(absl::StrCat(
          "the API key from ", source, " has a space, a control or a non-ASCII character; an "
          "API key is printable ASCII without spaces"));
    }
  }
  return key;
}

// `tandem generate --url=...`: the same flags, sent to a cluster's tandem.v1.Inference.
int RunRemoteGenerate(absl::string_view url) {
  absl::StatusOr<std::string> target = GrpcTarget(url);
  if (!target.ok()) return ExitCode(target.status());
  if (absl::GetFlag(FLAGS_json) || !absl::GetFlag(FLAGS_prompt_ids).empty() ||
      absl::GetFlag(FLAGS_logprobs) != 0 || absl::GetFlag(FLAGS_prompt_logprobs) != 0) {
    return ExitCode(absl::InvalidArgumentError(
        "--json, --prompt_ids, --logprobs and --prompt_logprobs work in this process only, not "
        "with --url (the OpenAI API's /v1/completions has logprobs and echo)"));
  }
  v1::GenerateRequest request;
  const std::string prompt = absl::GetFlag(FLAGS_prompt);
  if (absl::GetFlag(FLAGS_chat)) {
    v1::ChatMessages* chat = request.mutable_chat();
    if (!absl::GetFlag(FLAGS_system).empty()) {
      v1::ChatMessage* m = chat->add_messages();
      m->set_role("system");
      m->set_content(absl::GetFlag(FLAGS_system));
    }
    v1::ChatMessage* m = chat->add_messages();
    m->set_role("user");
    m->set_content(prompt);
  } else {
    request.set_prompt(prompt);
  }
  v1::SamplingParams* s = request.mutable_sampling();
  if (absl::GetFlag(FLAGS_max_tokens) <= 0) {
    return ExitCode(absl::InvalidArgumentError("--max_tokens must be positive"));
  }
  s->set_max_tokens(static_cast<uint32_t>(absl::GetFlag(FLAGS_max_tokens)));
  s->set_temperature(static_cast<float>(absl::GetFlag(FLAGS_temperature)));
  s->set_top_p(static_cast<float>(absl::GetFlag(FLAGS_top_p)));
  s->set_top_k(absl::GetFlag(FLAGS_top_k));
  s->set_min_p(static_cast<float>(absl::GetFlag(FLAGS_min_p)));
  s->set_repetition_penalty(static_cast<float>(absl::GetFlag(FLAGS_repetition_penalty)));
  if (absl::GetFlag(FLAGS_seed) >= 0) s->set_seed(static_cast<uint64_t>(absl::GetFlag(FLAGS_seed)));
  for (const std::string& stop : absl::GetFlag(FLAGS_stop)) s->add_stop(stop);
  request.set_priority(absl::GetFlag(FLAGS_priority));
  absl::StatusOr<std::string> api_key = ApiKey();
  if (!api_key.ok()) return ExitCode(api_key.status());

  // TLS with --tls_ca (and --tls_cert/--tls_key for a server that asks for a client
  // certificate); plaintext without.
  absl::StatusOr<TlsOptions> tls = TlsOptionsFromFlags();
  if (!tls.ok()) return ExitCode(tls.status());
  absl::StatusOr<ChannelSecurity> security = ChannelSecurityFor(*tls);
  if (!security.ok()) return ExitCode(security.status());
  grpc::ChannelArguments args;
  std::shared_ptr<grpc::ChannelCredentials> credentials = ApplyChannelSecurity(*security, &args);
  auto stub = v1::Inference::NewStub(grpc::CreateCustomChannel(*target, credentials, args));
  grpc::ClientContext context;
  context.set_wait_for_ready(false);
  if (!api_key->empty()) context.AddMetadata("authorization", absl::StrCat("Bearer ", *api_key));
  const absl::Time start = absl::Now();
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      stub->Generate(&context, request);
  v1::GenerateResponse response;
  v1::GenerateResponse last;
  absl::Duration ttft = absl::ZeroDuration();
  while (reader->Read(&response)) {
    if (ttft == absl::ZeroDuration() && response.token_ids_size() > 0) ttft = absl::Now() - start;
    std::fwrite(response.text().data(), 1, response.text().size(), stdout);
    std::fflush(stdout);
    if (response.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) last = response;
  }
  const grpc::Status status = reader->Finish();
  if (!status.ok()) {
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
      std::fprintf(stderr, "\nerror: no cluster answers at %s: %s\n", target->c_str(),
                   status.error_message().c_str());
      return 1;
    }
    if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
      std::fprintf(stderr,
                   "\nerror: the cluster at %s refused the request: %s (an API key comes from "
                   "--api_key, TANDEM_API_KEY or OPENAI_API_KEY)\n",
                   target->c_str(), status.error_message().c_str());
      return 1;
    }
    return ExitCode(status);
  }
  const absl::Duration total = absl::Now() - start;
  std::printf("\n");
  const v1::Usage& usage = last.usage();
  const v1::Timings& t = last.timings();
  const double decode_s = absl::ToDoubleSeconds(total - ttft);
  std::fprintf(stderr,
               "[%s] prompt: %u tokens (%u cached); generated: %u tokens; time to first token "
               "%.1f ms, then %.1f tokens/s; decode worker %s, prefill %s\n",
               std::string(absl::StripPrefix(v1::FinishReason_Name(last.finish_reason()),
                                             "FINISH_REASON_"))
                   .c_str(),
               usage.prompt_tokens(), usage.cached_prompt_tokens(), usage.completion_tokens(),
               absl::ToDoubleMilliseconds(ttft),
               decode_s > 0 && usage.completion_tokens() > 1
                   ? (usage.completion_tokens() - 1) / decode_s
                   : 0.0,
               t.decode_worker().c_str(),
               t.remote_prefill() ? absl::StrCat("on ", t.prefill_worker()).c_str() : "local");
  return 0;
}

// --prompt_ids: "1,2,3" as token ids (the engine checks them against the vocabulary).
absl::StatusOr<std::vector<int32_t>> ParsePromptIds(absl::string_view text) {
  std::vector<int32_t> ids;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int32_t id = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--prompt_ids must be comma-separated token ids, got '", part, "'"));
    }
    ids.push_back(id);
  }
  return ids;
}

nlohmann::json TopJson(const std::vector<sampling::TokenLogprob>& top) {
  nlohmann::json out = nlohmann::json::array();
  for (const sampling::TokenLogprob& t : top) out.push_back({{"id", t.id}, {"logprob", t.logprob}});
  return out;
}

// What --json prints, gathered from the deltas.
struct JsonResult {
  std::vector<int32_t> prompt;
  nlohmann::json prompt_logprobs = nlohmann::json::array();
  nlohmann::json tokens = nlohmann::json::array();
  std::string text = {};

  void Add(const GenerationDelta& d) {
    for (const sampling::SampledToken& t : d.prompt_logprobs) {
      prompt_logprobs.push_back(
          {{"id", t.id}, {"logprob", t.logprob.value_or(0.0f)}, {"top", TopJson(t.top_logprobs)}});
    }
    nlohmann::json token = {{"id", d.token}};
    if (d.logprob.has_value()) {
      token["logprob"] = *d.logprob;
      token["top"] = TopJson(d.top_logprobs);
    }
    // Every sampled token, the EOS token or the one that completed a stop string included
    // (whose text `text` omits).
    tokens.push_back(std::move(token));
    text += d.text;
  }

  std::string Dump(sampling::FinishReason finish) const {
    nlohmann::json out = {{"prompt_ids", prompt},
                          {"prompt_logprobs", prompt_logprobs},
                          {"tokens", tokens},
                          {"text", text},
                          {"finish_reason", std::string(sampling::FinishReasonName(finish))}};
    // Invalid UTF-8 cannot come out of the detokenizer (whole characters only); replace anyway
    // rather than throw.
    return out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
};

}  // namespace

int RunGenerate(const std::string& model_path) {
  if (!absl::GetFlag(FLAGS_url).empty()) return RunRemoteGenerate(absl::GetFlag(FLAGS_url));
  // The flags that go together, before the model loads.
  const std::string prompt_ids = absl::GetFlag(FLAGS_prompt_ids);
  if (!prompt_ids.empty() && (!absl::GetFlag(FLAGS_prompt).empty() || absl::GetFlag(FLAGS_chat))) {
    return ExitCode(
        absl::InvalidArgumentError("--prompt_ids replaces --prompt and --chat; give one"));
  }
  if (!absl::GetFlag(FLAGS_api_key).empty()) {
    return ExitCode(absl::InvalidArgumentError(
        "--api_key (or TANDEM_API_KEY) is for a cluster at --url; generating in this process "
        "needs no key"));
  }
  const bool json = absl::GetFlag(FLAGS_json);
  if (!json && (absl::GetFlag(FLAGS_logprobs) != 0 || absl::GetFlag(FLAGS_prompt_logprobs) != 0)) {
    return ExitCode(absl::InvalidArgumentError(
        "--logprobs and --prompt_logprobs are printed with --json only; add --json"));
  }
  LocalEngine::Options options;
  options.cpu.num_threads = absl::GetFlag(FLAGS_threads);
  absl::StatusOr<DType> kv_dtype = ParseKvDType(absl::GetFlag(FLAGS_kv_dtype));
  if (!kv_dtype.ok()) return ExitCode(kv_dtype.status());
  options.cpu.kv_dtype = *kv_dtype;
  auto engine = LocalEngine::Open(model_path, options);
  if (!engine.ok()) return ExitCode(engine.status());

  const std::string prompt = absl::GetFlag(FLAGS_prompt);
  absl::StatusOr<std::vector<int32_t>> tokens =
      prompt_ids.empty() ? (*engine)->EncodePrompt(prompt) : ParsePromptIds(prompt_ids);
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
  s.logprobs = absl::GetFlag(FLAGS_logprobs);
  request.prompt_logprobs = absl::GetFlag(FLAGS_prompt_logprobs);

  GenerationStats stats;
  sampling::FinishReason finish = sampling::FinishReason::kNone;
  JsonResult result{.prompt = request.prompt};
  const absl::Status status = (*engine)->Generate(
      {request},
      [&](const GenerationDelta& d) {
        if (json) {
          result.Add(d);
        } else {
          std::fwrite(d.text.data(), 1, d.text.size(), stdout);
          std::fflush(stdout);
        }
        finish = d.finish;
      },
      &stats);
  if (!status.ok()) return ExitCode(status);
  if (json) std::fputs(result.Dump(finish).c_str(), stdout);
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
