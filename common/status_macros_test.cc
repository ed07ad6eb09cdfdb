#include "common/status_macros.h"

#include <memory>
#include <string>

#include "absl/strings/cord.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

absl::Status Fail(absl::StatusCode code) { return absl::Status(code, "boom"); }

absl::StatusOr<std::unique_ptr<int>> MakeInt(bool ok, int value) {
  if (!ok) return absl::NotFoundError("no int");
  return std::make_unique<int>(value);
}

absl::Status ReturnIfError(const absl::Status& status, int* reached) {
  RETURN_IF_ERROR(status);
  ++*reached;
  return absl::OkStatus();
}

TEST(StatusMacrosTest, ReturnIfErrorPropagatesEveryCode) {
  for (int c = 1; c <= 16; ++c) {
    const auto code = static_cast<absl::StatusCode>(c);
    int reached = 0;
    const absl::Status got = ReturnIfError(Fail(code), &reached);
    EXPECT_EQ(got.code(), code);
    EXPECT_EQ(got.message(), "boom");
    EXPECT_EQ(reached, 0);
  }
  int reached = 0;
  EXPECT_TRUE(ReturnIfError(absl::OkStatus(), &reached).ok());
  EXPECT_EQ(reached, 1);
}

TEST(StatusMacrosTest, ReturnIfErrorAcceptsStatusOr) {
  auto f = [](bool ok) -> absl::Status {
    RETURN_IF_ERROR(MakeInt(ok, 1));
    return absl::OkStatus();
  };
  EXPECT_TRUE(f(true).ok());
  EXPECT_EQ(f(false).code(), absl::StatusCode::kNotFound);
}

TEST(StatusMacrosTest, ExpressionEvaluatedOnce) {
  int calls = 0;
  auto counted = [&]() -> absl::StatusOr<int> {
    ++calls;
    return 5;
  };
  auto f = [&]() -> absl::Status {
    RETURN_IF_ERROR(counted());
    ASSIGN_OR_RETURN(int v, counted());
    EXPECT_EQ(v, 5);
    return absl::OkStatus();
  };
  EXPECT_TRUE(f().ok());
  EXPECT_EQ(calls, 2);
}

TEST(StatusMacrosTest, AssignOrReturnMovesMoveOnlyValues) {
  auto f = [](bool ok) -> absl::StatusOr<int> {
    ASSIGN_OR_RETURN(std::unique_ptr<int> p, MakeInt(ok, 41));
    return *p + 1;
  };
  ASSERT_TRUE(f(true).ok());
  EXPECT_EQ(*f(true), 42);
  EXPECT_EQ(f(false).status().code(), absl::StatusCode::kNotFound);
}

TEST(StatusMacrosTest, AssignOrReturnIntoExistingVariableAndTwicePerScope) {
  auto f = []() -> absl::StatusOr<int> {
    std::unique_ptr<int> a;
    ASSIGN_OR_RETURN(a, MakeInt(true, 2));
    ASSIGN_OR_RETURN(auto b, MakeInt(true, 3));
    return *a * *b;
  };
  EXPECT_EQ(*f(), 6);
}

TEST(StatusMacrosTest, AnnotateKeepsCodeAndPayload) {
  absl::Status s = absl::InvalidArgumentError("top_p must be in (0, 1]");
  s.SetPayload("tandem/field", absl::Cord("top_p"));
  const absl::Status a = Annotate(s, "request r1");
  EXPECT_EQ(a.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a.message(), "request r1: top_p must be in (0, 1]");
  ASSERT_TRUE(a.GetPayload("tandem/field").has_value());
  EXPECT_EQ(*a.GetPayload("tandem/field"), "top_p");
  EXPECT_TRUE(Annotate(absl::OkStatus(), "ctx").ok());
  EXPECT_THAT(std::string(Annotate(s, "").message()), HasSubstr("top_p"));
}

}  // namespace
}  // namespace tandem
