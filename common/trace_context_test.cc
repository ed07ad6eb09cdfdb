#include "common/trace_context.h"

#include <random>
#include <sstream>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

constexpr absl::string_view kTrace = "4bf92f3577b34da6a3ce929d0e0e4736";
constexpr absl::string_view kParent = "00f067aa0ba902b7";
constexpr absl::string_view kValid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

TEST(TraceContextTest, ParsesVersion00) {
  absl::StatusOr<TraceContext> t = TraceContext::Parse(kValid, "congo=t61rcWkgMzE");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->trace_id(), kTrace);
  EXPECT_EQ(t->span_id(), kParent);
  EXPECT_EQ(t->flags(), 0x01);
  EXPECT_EQ(t->tracestate(), "congo=t61rcWkgMzE");
  EXPECT_EQ(t->traceparent(), kValid);
}

TEST(TraceContextTest, KeepsFlagsAndIgnoresSurroundingWhitespace) {
  absl::StatusOr<TraceContext> t = TraceContext::Parse(
      " \t00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00 ", " a=1 , b=2 ");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->flags(), 0x00);
  EXPECT_EQ(t->tracestate(), "a=1 , b=2");
  EXPECT_EQ(t->traceparent(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00");
  t = TraceContext::Parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-a3");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->flags(), 0xa3);
  EXPECT_EQ(t->traceparent(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-a3");
}

TEST(TraceContextTest, RefusesMalformedValues) {
  struct Case {
    std::string value;
    std::string why;  // part of the message
  };
  const Case cases[] = {
      {"", "0 characters"},
      {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0", "54 characters"},
      {"00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01", "separated by '-'"},
      {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-", "exactly 55"},
      {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", "exactly 55"},
      {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-011", "exactly 55"},
      {"00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01", "separated by '-'"},
      {"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", "trace id"},
      {"00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01", "parent id"},
      {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0A", "flags"},
      {"0A-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "version"},
      {"0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "version"},
      {"00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01", "trace id"},
      {"00-00000000000000000000000000000000-00f067aa0ba902b7-01", "trace id is all zeros"},
      {"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", "parent id is all zeros"},
      {"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "version ff"},
      {"cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x", "no '-' after its flags"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<TraceContext> t = TraceContext::Parse(c.value);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << c.value;
    EXPECT_THAT(t.status().message(), HasSubstr(c.why)) << c.value;
  }
}

TEST(TraceContextTest, LaterVersionsGiveTheirFirstFourFieldsAndGoOnAsVersion00) {
  for (absl::string_view value :
       {"cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds",
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-"}) {
    absl::StatusOr<TraceContext> t = TraceContext::Parse(value);
    ASSERT_TRUE(t.ok()) << value << ": " << t.status();
    EXPECT_EQ(t->trace_id(), kTrace);
    EXPECT_EQ(t->span_id(), kParent);
    EXPECT_EQ(t->traceparent(), kValid) << value;
  }
}

TEST(TraceContextTest, DropsAnUnusableTracestateButKeepsTheTraceparent) {
  for (const std::string& state :
       {std::string(kMaxTracestateBytes + 1, 'a'), std::string("a=1\nb=2"),
        std::string("a=\xc3\xa9")}) {
    absl::StatusOr<TraceContext> t = TraceContext::Parse(kValid, state);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->tracestate(), "");
  }
  absl::StatusOr<TraceContext> t = TraceContext::Parse(kValid, std::string(kMaxTracestateBytes, 'a'));
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->tracestate().size(), kMaxTracestateBytes);
}

TEST(TraceContextTest, NewTracesAreValidDistinctAndFromTheGivenBits) {
  absl::flat_hash_set<std::string> traces;
  for (int i = 0; i < 1000; ++i) {
    const TraceContext t = TraceContext::NewTrace();
    EXPECT_THAT(t.traceparent(), MatchesRegex("00-[0-9a-f]{32}-[0-9a-f]{16}-01"));
    absl::StatusOr<TraceContext> back = TraceContext::Parse(t.traceparent());
    ASSERT_TRUE(back.ok()) << t.traceparent() << ": " << back.status();
    EXPECT_EQ(*back, t);
    traces.insert(t.trace_id());
  }
  EXPECT_EQ(traces.size(), 1000u);

  std::mt19937_64 a(7), b(7);
  EXPECT_EQ(TraceContext::NewTrace(a), TraceContext::NewTrace(b));
}

TEST(TraceContextTest, AChildKeepsTheTraceFlagsAndStateWithANewSpan) {
  const TraceContext parent = *TraceContext::Parse(kValid, "congo=t61rcWkgMzE");
  std::mt19937_64 bits(1);
  const TraceContext child = parent.Child(bits);
  EXPECT_EQ(child.trace_id(), parent.trace_id());
  EXPECT_NE(child.span_id(), parent.span_id());
  EXPECT_EQ(child.parent_id(), parent.span_id());
  EXPECT_EQ(parent.parent_id(), "");
  EXPECT_THAT(child.span_id(), MatchesRegex("[0-9a-f]{16}"));
  EXPECT_EQ(child.flags(), parent.flags());
  EXPECT_EQ(child.tracestate(), parent.tracestate());
  EXPECT_NE(child.Child().span_id(), child.span_id());
}

TEST(TraceContextTest, SpanForRequestContinuesAValidTraceAndReplacesAMalformedOne) {
  absl::Status rejected = absl::UnknownError("unset");
  TraceContext span = SpanForRequest({kValid}, {"a=1"}, &rejected);
  EXPECT_TRUE(rejected.ok()) << rejected;
  EXPECT_EQ(span.trace_id(), kTrace);
  EXPECT_NE(span.span_id(), kParent);
  EXPECT_EQ(span.parent_id(), kParent);
  EXPECT_EQ(span.tracestate(), "a=1");

  span = SpanForRequest({}, {"a=1"}, &rejected);
  EXPECT_TRUE(rejected.ok()) << rejected;  // nothing sent: nothing rejected
  EXPECT_NE(span.trace_id(), kTrace);
  EXPECT_EQ(span.tracestate(), "");

  span = SpanForRequest({"00-00000000000000000000000000000000-00f067aa0ba902b7-01"}, {"a=1"},
                        &rejected);
  EXPECT_EQ(rejected.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(span.trace_id(), MatchesRegex("[0-9a-f]{32}"));
  EXPECT_NE(span.trace_id(), std::string(32, '0'));
  EXPECT_EQ(span.tracestate(), "");  // it went with the malformed traceparent
  SpanForRequest({"garbage"}, {}, nullptr);  // `rejected` may be null

  // Repeated tracestate headers join; several traceparents are malformed.
  span = SpanForRequest({kValid}, {"a=1", "b=2"}, &rejected);
  EXPECT_TRUE(rejected.ok()) << rejected;
  EXPECT_EQ(span.tracestate(), "a=1,b=2");
  span = SpanForRequest({kValid, kValid}, {}, &rejected);
  EXPECT_EQ(rejected.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(rejected.message(), HasSubstr("2 traceparents"));
  EXPECT_NE(span.trace_id(), kTrace);
}

TEST(TraceContextTest, MessagesQuoteOnlyTheStartOfALongValue) {
  const std::string value = std::string(kValid) + std::string(1000, '-');
  absl::StatusOr<TraceContext> t = TraceContext::Parse(value);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(t.status().message().size(), 200u) << t.status();
}

TEST(TraceContextTest, TraceTagWritesTheLogFields) {
  const TraceContext t = *TraceContext::Parse(kValid);
  std::ostringstream os;
  os << TraceTag(t) << "placed";
  EXPECT_EQ(os.str(), absl::StrCat("trace_id=", kTrace, " span_id=", kParent, " placed"));
  EXPECT_EQ(ParentOf(t), "");
  EXPECT_EQ(ParentOf(t.Child()), absl::StrCat(" (parent span ", kParent, ")"));
}

}  // namespace
}  // namespace tandem
