#include "cli/generate.h"

#include <cstdio>
#include <optional>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/status_conversion.h"
#include "engine/runtime/local_engine.h"
#include "grpcpp/create_channel.h"
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
ABSL_FLAG(int32_t, priority, 0, "Scheduling priority of the request with --url (higher first)");

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

// `tandem generate --url=...`: the same flags, sent to a cluster's tandem.v1.Inference.
int RunRemoteGenerate(absl::string_view url) {
  absl::StatusOr<std::string> target = GrpcTarget(url);
  if (!target.ok()) return ExitCode(target.status());
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

  auto stub = v1::Inference::NewStub(grpc::CreateChannel(*target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_wait_for_ready(false);
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

}  // namespace

int RunGenerate(const std::string& model_path) {
  if (!absl::GetFlag(FLAGS_url).empty()) return RunRemoteGenerate(absl::GetFlag(FLAGS_url));
  LocalEngine::Options options;
  options.cpu.num_threads = absl::GetFlag(FLAGS_threads);
  absl::StatusOr<DType> kv_dtype = ParseKvDType(absl::GetFlag(FLAGS_kv_dtype));
  if (!kv_dtype.ok()) return ExitCode(kv_dtype.status());
  options.cpu.kv_dtype = *kv_dtype;
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
