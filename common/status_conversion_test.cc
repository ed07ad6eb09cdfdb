#include "common/status_conversion.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

TEST(StatusConversionTest, EveryCodeRoundTripsWithMessage) {
  for (int c = 0; c <= 16; ++c) {
    const auto code = static_cast<absl::StatusCode>(c);
    const absl::Status original(code, c == 0 ? "" : "message for code " + std::to_string(c));
    const grpc::Status wire = ToGrpcStatus(original);
    EXPECT_EQ(static_cast<int>(wire.error_code()), c);
    EXPECT_EQ(wire.error_message(), std::string(original.message()));
    EXPECT_EQ(FromGrpcStatus(wire), original) << "code " << c;
  }
}

TEST(StatusConversionTest, OutOfRangeGrpcCodeBecomesUnknown) {
  // 20 is no gRPC code but lies within the enum's value range (0..31), so it is no UB.
  const grpc::Status odd(static_cast<grpc::StatusCode>(20), "from the future");
  const absl::Status got = FromGrpcStatus(odd);
  EXPECT_EQ(got.code(), absl::StatusCode::kUnknown);
  EXPECT_THAT(std::string(got.message()), HasSubstr("20"));
  EXPECT_THAT(std::string(got.message()), HasSubstr("from the future"));
}

TEST(StatusConversionTest, HttpStatus) {
  struct Case {
    absl::StatusCode code;
    int http;
  };
  for (const Case& c : {Case{absl::StatusCode::kOk, 200}, Case{absl::StatusCode::kInvalidArgument, 400},
                        Case{absl::StatusCode::kOutOfRange, 400}, Case{absl::StatusCode::kNotFound, 404},
                        Case{absl::StatusCode::kResourceExhausted, 429},
                        Case{absl::StatusCode::kUnavailable, 503},
                        Case{absl::StatusCode::kDeadlineExceeded, 504},
                        Case{absl::StatusCode::kInternal, 500}, Case{absl::StatusCode::kUnknown, 500},
                        Case{absl::StatusCode::kDataLoss, 500}}) {
    EXPECT_EQ(HttpStatusFromCode(c.code), c.http) << absl::StatusCodeToString(c.code);
  }
}

TEST(StatusConversionTest, RetryAfterRidesAlongAndRoundsUpToWholeSeconds) {
  const absl::Status refused =
      WithRetryAfter(absl::ResourceExhaustedError("busy"), absl::Milliseconds(2300));
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(refused.message(), "busy");
  ASSERT_TRUE(RetryAfter(refused).has_value());
  EXPECT_EQ(*RetryAfter(refused), absl::Milliseconds(2300));
  EXPECT_EQ(RetryAfterSeconds(*RetryAfter(refused)), 3);
  EXPECT_EQ(RetryAfterSeconds(absl::ZeroDuration()), 1);
  EXPECT_EQ(RetryAfterSeconds(absl::Seconds(4)), 4);
  EXPECT_FALSE(RetryAfter(absl::ResourceExhaustedError("busy")).has_value());
  // An OK status carries no hint.
  EXPECT_FALSE(RetryAfter(WithRetryAfter(absl::OkStatus(), absl::Seconds(1))).has_value());
}

TEST(StatusConversionTest, TheParamCrossesGrpcAsABadRequestDetail) {
  const absl::Status refused =
      WithParam(absl::InvalidArgumentError("'top_p' must be in (0, 1]"), "top_p");
  const grpc::Status wire = ToGrpcStatus(refused);
  EXPECT_FALSE(wire.error_details().empty());
  const absl::Status back = FromGrpcStatus(wire);
  EXPECT_EQ(back, refused);  // code, message and the param payload
  EXPECT_EQ(ParamOf(back), "top_p");
  // Without a param: no details.
  EXPECT_TRUE(ToGrpcStatus(absl::InvalidArgumentError("bad")).error_details().empty());
  EXPECT_EQ(ParamOf(FromGrpcStatus(ToGrpcStatus(absl::InvalidArgumentError("bad")))),
            std::nullopt);
}

TEST(StatusConversionTest, MalformedDetailsFromAPeerAreIgnored) {
  const std::string details =
      ToGrpcStatus(WithParam(absl::InvalidArgumentError("no"), "messages[2].content"))
          .error_details();
  // Every cut of valid details, and bytes that are no message: never a crash; a param only
  // where the violation's field is whole.
  for (size_t n = 0; n < details.size(); ++n) {
    const absl::Status got =
        FromGrpcStatus(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no", details.substr(0, n)));
    EXPECT_EQ(got.code(), absl::StatusCode::kInvalidArgument);
    const std::optional<std::string> param = ParamOf(got);
    EXPECT_TRUE(!param.has_value() || *param == "messages[2].content") << n << ": " << *param;
  }
  for (const std::string& junk : {std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 11),
                                 std::string("\x1a\x7f", 2), std::string("\x0f", 1)}) {
    EXPECT_EQ(ParamOf(FromGrpcStatus(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no", junk))),
              std::nullopt);
  }
}

}  // namespace
}  // namespace tandem
