// The OpenAI-compatible HTTP API's JSON (docs/api.md): request bodies of /v1/completions and
// /v1/chat/completions read into tandem.v1.GenerateRequest, and error bodies and finish reasons
// in OpenAI's shapes. Pure functions, no I/O: the HTTP server (http_server.cc) does the rest.
#ifndef TANDEM_ROUTER_SERVER_OPENAI_JSON_H_
#define TANDEM_ROUTER_SERVER_OPENAI_JSON_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tandem/v1/inference.pb.h"

namespace tandem::router {

// What an OpenAI request asks for.
struct OpenAiRequest {
  v1::GenerateRequest request;
  bool stream = false;         // "stream": server-sent events
  bool include_usage = false;  // "stream_options": {"include_usage": true}
};

// Reads the body of a completions (`chat` false) or chat completions request. INVALID_ARGUMENT
// with a message naming the field for anything malformed: not JSON, not an object, a missing
// prompt or messages, a field of the wrong type or out of range, n other than 1, content parts
// other than text. Completions default max_tokens to 16 (OpenAI's default); chat leaves it unset
// (up to the context), and takes max_completion_tokens over max_tokens.
absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(absl::string_view body, bool chat);

// {"error": {"message", "type", "code"}} for `status`; type invalid_request_error (HTTP 400,
// 404, 413), rate_limit_error (429) or server_error.
std::string OpenAiErrorBody(const absl::Status& status);

// The body of GET /v1/models: {"object": "list", "data": [...]}, one OpenAI model object per
// entry (id, object "model", created, owned_by) with Tandem's max_model_len (context length in
// tokens), format ("gguf" or "hf") and architecture.
std::string OpenAiModelList(const v1::ListModelsResponse& models);

// "stop", "length", "abort", "error", or "" while the stream goes on.
std::string OpenAiFinishReason(v1::FinishReason reason);

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_SERVER_OPENAI_JSON_H_
