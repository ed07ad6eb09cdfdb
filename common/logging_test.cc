#include "common/logging.h"

#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

class CapturingSink final : public LogSink {
 public:
  void Write(absl::string_view line) override {
    absl::MutexLock lock(&mu_);
    lines_.emplace_back(line);
  }
  std::vector<std::string> lines() {
    absl::MutexLock lock(&mu_);
    return lines_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
};

class LoggingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = GetLogOptions();
    previous_ = SetLogSinkForTesting(&sink_);
  }
  void TearDown() override {
    SetLogSinkForTesting(previous_);
    SetLogOptions(saved_);
  }
  CapturingSink sink_;
  LogSink* previous_ = nullptr;
  LogOptions saved_;
};

LogRecord FixedRecord(absl::string_view message) {
  LogRecord r;
  r.time = absl::FromUnixMicros(1764684000123456);  // 2025-12-02T14:00:00.123456Z
  r.severity = LogSeverity::kWarning;
  r.file = "/src/router/http_server.cc";
  r.line = 42;
  r.thread_id = 7;
  r.message = message;
  return r;
}

TEST_F(LoggingTest, TextFormat) {
  EXPECT_EQ(FormatLogRecord(FixedRecord("slow peer"), LogFormat::kText),
            "2025-12-02T14:00:00.123456Z W 7 http_server.cc:42] slow peer");
}

TEST_F(LoggingTest, JsonFormatEscapesEverything) {
  EXPECT_EQ(FormatLogRecord(FixedRecord("say \"hi\"\\\n\t\x01"), LogFormat::kJson),
            "{\"ts\":\"2025-12-02T14:00:00.123456Z\",\"level\":\"WARNING\",\"thread\":7,"
            "\"src\":\"http_server.cc:42\",\"msg\":\"say \\\"hi\\\"\\\\\\n\\t\\u0001\"}");
}

TEST(JsonStringTest, KeepsValidUtf8AndReplacesInvalidBytes) {
  struct Case {
    std::string in, want;
  };
  const std::vector<Case> cases = {
      {"plain", "\"plain\""},
      {"\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4", "\"\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4\""},  // 한국어
      {"\xF0\x9F\x98\x80", "\"\xF0\x9F\x98\x80\""},                                  // emoji
      {"a\xFF" "b", "\"a\xEF\xBF\xBD" "b\""},                                        // stray byte
      {"\xE4\xB8", "\"\xEF\xBF\xBD\xEF\xBF\xBD\""},                                  // truncated
      {"\xC0\xAF", "\"\xEF\xBF\xBD\xEF\xBF\xBD\""},                                  // overlong
      {"\xED\xA0\x80", "\"\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\""},                  // surrogate
      {"del\x7F", "\"del\\u007f\""},
  };
  for (const Case& c : cases) {
    std::string out;
    AppendJsonString(&out, c.in);
    EXPECT_EQ(out, c.want) << "input: " << c.in;
  }
}

TEST_F(LoggingTest, WritesWholeLinesToSink) {
  LOG(INFO) << "listening on " << 8000;
  LOG(ERROR) << "peer lost";
  const auto lines = sink_.lines();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_THAT(lines[0], HasSubstr(" I "));
  EXPECT_THAT(lines[0], HasSubstr("logging_test.cc:"));
  EXPECT_THAT(lines[0], HasSubstr("] listening on 8000\n"));
  EXPECT_THAT(lines[1], HasSubstr("] peer lost\n"));
}

TEST_F(LoggingTest, BelowMinimumIsDroppedAndNotEvaluated) {
  SetLogOptions({.min_severity = LogSeverity::kWarning, .format = LogFormat::kJson});
  int evaluated = 0;
  auto side_effect = [&] { return ++evaluated; };
  LOG(DEBUG) << side_effect();
  LOG(INFO) << side_effect();
  LOG(WARNING) << "kept " << side_effect();
  EXPECT_EQ(evaluated, 1);
  const auto lines = sink_.lines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], StartsWith("{\"ts\":"));
  EXPECT_THAT(lines[0], HasSubstr("\"level\":\"WARNING\""));
  EXPECT_THAT(lines[0], HasSubstr("\"msg\":\"kept 1\"}\n"));
}

TEST(LogParseTest, SeverityAndFormat) {
  EXPECT_EQ(*ParseLogSeverity("DEBUG"), LogSeverity::kDebug);
  EXPECT_EQ(*ParseLogSeverity("warn"), LogSeverity::kWarning);
  EXPECT_EQ(*ParseLogSeverity("Error"), LogSeverity::kError);
  EXPECT_EQ(ParseLogSeverity("loud").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ParseLogSeverity("loud").status().message()), HasSubstr("'loud'"));
  EXPECT_EQ(*ParseLogFormat("json"), LogFormat::kJson);
  EXPECT_EQ(ParseLogFormat("xml").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CheckDeathTest, FailedCheckAbortsWithConditionAndMessage) {
  const int blocks = 3;
  EXPECT_DEATH(CHECK(blocks > 5) << "pool has " << blocks, "Check failed: blocks > 5 pool has 3");
  EXPECT_DEATH(CHECK_OK(absl::InternalError("torn state")), "torn state");
  EXPECT_DEATH(LOG(FATAL) << "unrecoverable", "unrecoverable");
  CHECK(blocks == 3) << "never printed";
  CHECK_OK(absl::OkStatus());
}

}  // namespace
}  // namespace tandem
