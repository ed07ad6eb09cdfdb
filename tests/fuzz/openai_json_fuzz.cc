// Fuzzes the OpenAI API's request bodies (router/server/openai_json.h): the input is one HTTP
// body, read as a chat completions, a completions, a /tokenize and a /detokenize request. A
// refusal must be INVALID_ARGUMENT (HTTP 400) and render as OpenAI's error shape (JSON).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "router/server/openai_json.h"

namespace {

void CheckRefusal(const absl::Status& status) {
  if (status.ok()) return;
  // The parsers refuse only with INVALID_ARGUMENT (HTTP 400); anything else would be a 500.
  if (status.code() != absl::StatusCode::kInvalidArgument) std::abort();
  const std::string body = tandem::router::OpenAiErrorBody(status);
  if (body.empty() || !nlohmann::json::accept(body)) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view body(reinterpret_cast<const char*>(data), size);
  for (bool chat : {true, false}) {
    auto request = tandem::router::ParseOpenAiRequest(body, chat);
    CheckRefusal(request.status());
    if (request.ok()) {
      // What the router then sends on: the proto must serialize.
      std::string wire;
      if (!request->request.SerializeToString(&wire)) std::abort();
    }
  }
  CheckRefusal(tandem::router::ParseTokenizeRequest(body).status());
  CheckRefusal(tandem::router::ParseDetokenizeRequest(body).status());
  return 0;
}
