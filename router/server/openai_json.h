// The OpenAI-compatible HTTP API's JSON (docs/api.md): request bodies of /v1/completions,
// /v1/chat/completions, /tokenize and /detokenize read into Tandem's protos, and the pieces of
// answers in OpenAI's shapes (errors, finish reasons, log-probabilities, the model list). Pure
// functions, no I/O: the HTTP server (http_server.cc) does the rest.
//
// Strictness: a request field is either applied, or accepted only with the value that changes
// nothing (e.g. "logit_bias": {}), or refused with INVALID_ARGUMENT whose message and param
// (common/status_conversion.h WithParam) name it. Nothing is ignored.
#ifndef TANDEM_ROUTER_SERVER_OPENAI_JSON_H_
#define TANDEM_ROUTER_SERVER_OPENAI_JSON_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "tandem/v1/inference.pb.h"

namespace tandem::router {

// The most choices (n) and candidates (best_of) one request may ask for, as OpenAI's API.
inline constexpr int kMaxChoices = 128;
inline constexpr int kMaxBestOf = 20;
// Completions' "prompt" may hold a batch of at most kMaxPrompts prompts, and prompts × best_of
// may be at most kMaxBatchCandidates sequences.
inline constexpr int kMaxPrompts = 256;
inline constexpr int kMaxBatchCandidates = 256;
// The most alternatives per token (completions' logprobs, chat's top_logprobs), as OpenAI's API
// and the engine's limit (SamplingParams.logprobs).
inline constexpr int kMaxTopLogprobs = 20;
// The most stop strings, as OpenAI's API.
inline constexpr int kMaxStops = 4;

// What an OpenAI request asks for.
struct OpenAiRequest {
  // The request of one candidate. Its SamplingParams.logprobs is what the engine must return
  // (at least 1 when log-probabilities are asked for or best_of > n needs them to rank).
  v1::GenerateRequest request;
  bool stream = false;         // "stream": server-sent events
  bool include_usage = false;  // "stream_options": {"include_usage": true}
  // "n": choices returned; "best_of" (completions): candidates generated, >= n. With best_of > n
  // the n candidates with the highest cumulative log-probability are returned (not streamed).
  int n = 1;
  int best_of = 1;
  // The alternatives per token the client asked for: completions' "logprobs" (0..20), chat's
  // "top_logprobs" (with "logprobs": true; 0 when absent); nullopt: no log-probabilities.
  std::optional<int> logprobs;
  // Completions' "echo": the choices start with the prompt's text, and with logprobs, their
  // "logprobs" with the prompt's tokens (SamplingParams.prompt_logprobs is set).
  bool echo = false;
  // "max_tokens": 0 (only with echo): the request asks the engine for one token (its least),
  // which the reply drops: no text, no logprobs, no usage, finish_reason "length".
  bool max_tokens_zero = false;
  // Completions whose "prompt" is a batch (several strings or token-id arrays): one request per
  // prompt, in order, each `request` with that prompt as its input (batch[0] == request); empty
  // for one prompt. Choices come back prompt by prompt: prompt p's n are indices p·n .. p·n+n-1.
  std::vector<v1::GenerateRequest> batch;
};

// Reads the body of a completions (`chat` false) or chat completions request. INVALID_ARGUMENT
// with the field as param (and in the message) for anything refused: not JSON, not an object, a
// missing prompt or messages, a message without content, a field of the wrong type or out of
// range, a field Tandem does not know or support. Completions default max_tokens to 16
// (OpenAI's default); chat leaves it unset (up to the context).
absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(absl::string_view body, bool chat);

// Reads a /tokenize body (vLLM's shape): {"model", "prompt", "add_special_tokens"} or
// {"model", "messages", "tools", "add_generation_prompt", "add_special_tokens"}.
// INVALID_ARGUMENT naming the field otherwise.
absl::StatusOr<v1::TokenizeRequest> ParseTokenizeRequest(absl::string_view body);

// A /detokenize body: {"model", "tokens": [ids]}.
struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;
};
absl::StatusOr<DetokenizeRequest> ParseDetokenizeRequest(absl::string_view body);

// {"error": {"message", "type", "param", "code"}} for `status`; type invalid_request_error
// (HTTP 400, 401, 404, 413), rate_limit_error (429) or server_error; param from ParamOf(status),
// or null; code the gRPC code's name, but OpenAI's "invalid_api_key" for a 401.
std::string OpenAiErrorBody(const absl::Status& status);

// The body of GET /v1/models: {"object": "list", "data": [...]}, one OpenAI model object per
// entry (id, object "model", created, owned_by) with Tandem's max_model_len (context length in
// tokens), format ("gguf" or "hf") and architecture.
std::string OpenAiModelList(const v1::ListModelsResponse& models);

// "stop", "length", "abort", "error", or "" while the stream goes on.
std::string OpenAiFinishReason(v1::FinishReason reason);

// One generated token with its log-probability and alternatives, their texts already looked up
// (the token's bytes as they appear in decoded text; may be part of a UTF-8 character).
struct TokenWithLogprobs {
  std::string token;
  float logprob = 0;
  std::vector<std::pair<std::string, float>> top;  // most likely first
};

// Completions' "logprobs" object for `tokens`: {"tokens", "token_logprobs", "top_logprobs" (one
// {token: logprob} object per position; of `top_n` entries, or null for top_n 0),
// "text_offset"}. Offsets count characters (code points) from the start of the choice's text,
// `offset` being that of the first token (the text before it, in a stream).
nlohmann::json CompletionLogprobs(const std::vector<TokenWithLogprobs>& tokens, int top_n,
                                  int64_t offset);

// Chat's "logprobs" object: {"content": [{"token", "logprob", "bytes", "top_logprobs":
// [{"token", "logprob", "bytes"}, ...]}]}, `top_n` alternatives per token.
nlohmann::json ChatLogprobs(const std::vector<TokenWithLogprobs>& tokens, int top_n);

// Characters (code points) in `utf8`: the bytes that are not UTF-8 continuation bytes.
int64_t CountCharacters(absl::string_view utf8);

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_SERVER_OPENAI_JSON_H_
