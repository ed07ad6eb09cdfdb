#include "proto/conversion.h"

#include <algorithm>

namespace tandem {

uint64_t MicrosForProto(absl::Duration d) {
  return static_cast<uint64_t>(std::max<int64_t>(absl::ToInt64Microseconds(d), 0));
}

sampling::SamplingOptions SamplingFromProto(const v1::SamplingParams& p) {
  sampling::SamplingOptions o;
  if (p.has_max_tokens()) o.max_tokens = p.max_tokens();
  if (p.has_temperature()) o.temperature = p.temperature();
  if (p.has_top_p()) o.top_p = p.top_p();
  if (p.has_min_p()) o.min_p = p.min_p();
  if (p.has_top_k()) o.top_k = p.top_k();
  if (p.has_repetition_penalty()) o.repetition_penalty = p.repetition_penalty();
  if (p.has_frequency_penalty()) o.frequency_penalty = p.frequency_penalty();
  if (p.has_presence_penalty()) o.presence_penalty = p.presence_penalty();
  if (p.has_seed()) o.seed = p.seed();
  o.stop.assign(p.stop().begin(), p.stop().end());
  o.stop_token_ids.assign(p.stop_token_ids().begin(), p.stop_token_ids().end());
  o.ignore_eos = p.ignore_eos();
  if (p.has_min_tokens()) o.min_tokens = p.min_tokens();
  o.logprobs = p.logprobs();
  if (p.has_response_format()) {
    using Kind = sampling::ResponseFormat::Kind;
    const v1::ResponseFormat& f = p.response_format();
    sampling::ResponseFormat& out = o.response_format;
    switch (f.format_case()) {
      case v1::ResponseFormat::kJsonObject:
        out.kind = Kind::kJsonObject;
        break;
      case v1::ResponseFormat::kJsonSchema:
        out = {.kind = Kind::kJsonSchema, .text = f.json_schema()};
        break;
      case v1::ResponseFormat::kRegex:
        out = {.kind = Kind::kRegex, .text = f.regex()};
        break;
      case v1::ResponseFormat::kEbnf:
        out = {.kind = Kind::kEbnf, .text = f.ebnf()};
        break;
      case v1::ResponseFormat::kStructuralTag:
        out = {.kind = Kind::kStructuralTag, .text = f.structural_tag()};
        break;
      case v1::ResponseFormat::FORMAT_NOT_SET:
        break;
    }
  }
  return o;
}

v1::FinishReason FinishReasonToProto(sampling::FinishReason reason) {
  return static_cast<v1::FinishReason>(static_cast<int>(reason));
}

}  // namespace tandem
