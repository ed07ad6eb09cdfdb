#include "proto/conversion.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;

TEST(SamplingFromProtoTest, AbsentFieldsKeepTheEngineDefaults) {
  const sampling::SamplingOptions defaults;
  const sampling::SamplingOptions o = SamplingFromProto(v1::SamplingParams());
  EXPECT_EQ(o.max_tokens, defaults.max_tokens);
  EXPECT_EQ(o.temperature, defaults.temperature);
  EXPECT_EQ(o.top_p, defaults.top_p);
  EXPECT_EQ(o.min_p, defaults.min_p);
  EXPECT_EQ(o.top_k, defaults.top_k);
  EXPECT_EQ(o.repetition_penalty, defaults.repetition_penalty);
  EXPECT_EQ(o.frequency_penalty, defaults.frequency_penalty);
  EXPECT_EQ(o.presence_penalty, defaults.presence_penalty);
  EXPECT_EQ(o.seed, defaults.seed);
  EXPECT_EQ(o.min_tokens, defaults.min_tokens);
  EXPECT_EQ(o.logprobs, defaults.logprobs);
  EXPECT_FALSE(o.ignore_eos);
  EXPECT_TRUE(o.stop.empty());
  EXPECT_TRUE(o.stop_token_ids.empty());
}

TEST(SamplingFromProtoTest, EverySetFieldIsCarried) {
  v1::SamplingParams p;
  p.set_max_tokens(7);
  p.set_temperature(0.5f);
  p.set_top_p(0.75f);
  p.set_min_p(0.125f);
  p.set_top_k(3);
  p.set_repetition_penalty(1.25f);
  p.set_frequency_penalty(-0.5f);
  p.set_presence_penalty(0.25f);
  p.set_seed(42);
  p.add_stop("END");
  p.add_stop("\n\n");
  p.add_stop_token_ids(2);
  p.set_ignore_eos(true);
  p.set_min_tokens(4);
  p.set_logprobs(5);
  const sampling::SamplingOptions o = SamplingFromProto(p);
  EXPECT_EQ(o.max_tokens, 7);
  EXPECT_EQ(o.temperature, 0.5f);
  EXPECT_EQ(o.top_p, 0.75f);
  EXPECT_EQ(o.min_p, 0.125f);
  EXPECT_EQ(o.top_k, 3);
  EXPECT_EQ(o.repetition_penalty, 1.25f);
  EXPECT_EQ(o.frequency_penalty, -0.5f);
  EXPECT_EQ(o.presence_penalty, 0.25f);
  EXPECT_EQ(o.seed, 42u);
  EXPECT_THAT(o.stop, ElementsAre("END", "\n\n"));
  EXPECT_THAT(o.stop_token_ids, ElementsAre(2));
  EXPECT_TRUE(o.ignore_eos);
  EXPECT_EQ(o.min_tokens, 4);
  EXPECT_EQ(o.logprobs, 5);
}

TEST(SamplingFromProtoTest, EveryResponseFormatIsCarried) {
  using Kind = sampling::ResponseFormat::Kind;
  EXPECT_EQ(SamplingFromProto(v1::SamplingParams()).response_format.kind, Kind::kText);
  v1::SamplingParams p;
  p.mutable_response_format();  // set, but no format chosen: no constraint
  EXPECT_EQ(SamplingFromProto(p).response_format.kind, Kind::kText);
  p.mutable_response_format()->mutable_json_object();
  EXPECT_EQ(SamplingFromProto(p).response_format,
            (sampling::ResponseFormat{.kind = Kind::kJsonObject, .text = ""}));
  p.mutable_response_format()->set_json_schema(R"({"type":"object"})");
  EXPECT_EQ(SamplingFromProto(p).response_format,
            (sampling::ResponseFormat{.kind = Kind::kJsonSchema, .text = R"({"type":"object"})"}));
  p.mutable_response_format()->set_regex("[0-9]+");
  EXPECT_EQ(SamplingFromProto(p).response_format,
            (sampling::ResponseFormat{.kind = Kind::kRegex, .text = "[0-9]+"}));
  p.mutable_response_format()->set_ebnf("root ::= \"a\"");
  EXPECT_EQ(SamplingFromProto(p).response_format,
            (sampling::ResponseFormat{.kind = Kind::kEbnf, .text = "root ::= \"a\""}));
  p.mutable_response_format()->set_structural_tag(R"({"type":"structural_tag"})");
  EXPECT_EQ(SamplingFromProto(p).response_format,
            (sampling::ResponseFormat{.kind = Kind::kStructuralTag,
                                      .text = R"({"type":"structural_tag"})"}));
}

TEST(FinishReasonToProtoTest, EveryReasonMapsToItsNamesake) {
  using sampling::FinishReason;
  EXPECT_EQ(FinishReasonToProto(FinishReason::kNone), v1::FINISH_REASON_UNSPECIFIED);
  EXPECT_EQ(FinishReasonToProto(FinishReason::kStop), v1::FINISH_REASON_STOP);
  EXPECT_EQ(FinishReasonToProto(FinishReason::kStopString), v1::FINISH_REASON_STOP_STRING);
  EXPECT_EQ(FinishReasonToProto(FinishReason::kLength), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(FinishReasonToProto(FinishReason::kCancelled), v1::FINISH_REASON_CANCELLED);
  EXPECT_EQ(FinishReasonToProto(FinishReason::kError), v1::FINISH_REASON_ERROR);
}

TEST(MicrosForProtoTest, WholeMicrosecondsAndNeverNegative) {
  EXPECT_EQ(MicrosForProto(absl::Microseconds(1500)), 1500u);
  EXPECT_EQ(MicrosForProto(absl::Nanoseconds(2999)), 2u);
  EXPECT_EQ(MicrosForProto(absl::ZeroDuration()), 0u);
  EXPECT_EQ(MicrosForProto(absl::Milliseconds(-3)), 0u);
}

}  // namespace
}  // namespace tandem
