#include "engine/sampling/stop_checker.h"

#include <cstddef>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::sampling {
namespace {

// Independent reference: the first end position at which some stop string ends in `text`; among
// those ending there, the longest. Returns the text to emit and the index of the match (or -1).
std::pair<std::string, int> ReferenceStop(const std::string& text,
                                          const std::vector<std::string>& stops) {
  for (size_t end = 1; end <= text.size(); ++end) {
    int best = -1;
    for (size_t j = 0; j < stops.size(); ++j) {
      const std::string& s = stops[j];
      if (s.size() <= end && text.compare(end - s.size(), s.size(), s) == 0 &&
          (best < 0 || s.size() > stops[static_cast<size_t>(best)].size())) {
        best = static_cast<int>(j);
      }
    }
    if (best >= 0) return {text.substr(0, end - stops[static_cast<size_t>(best)].size()), best};
  }
  return {text, -1};
}

// Every way to cut `text` into at most three deltas (empty deltas included).
std::vector<std::vector<std::string>> AllSplits(const std::string& text) {
  std::vector<std::vector<std::string>> splits;
  for (size_t a = 0; a <= text.size(); ++a) {
    for (size_t b = a; b <= text.size(); ++b) {
      splits.push_back({text.substr(0, a), text.substr(a, b - a), text.substr(b)});
    }
  }
  std::vector<std::string> bytes;  // and byte by byte
  for (char c : text) bytes.emplace_back(1, c);
  splits.push_back(bytes);
  return splits;
}

struct MatchCase {
  std::string text;
  std::vector<std::string> stops;
};

const MatchCase kMatchCases[] = {
    {"The END.", {"END"}},
    {"The EN", {"END"}},                 // no match: all text comes out at Flush
    {"END of it", {"END"}},              // match at the very start
    {"END", {"END"}},                    // the text is the stop string
    {"Say ENDING now", {"ENDING", "END"}},  // END ends first
    {"Say ENDING now", {"END", "ENDING"}},
    {"abcd", {"abcd", "bc"}},            // bc ends first, though abcd starts first
    {"xxEND", {"ND", "END"}},            // same end: the longer wins
    {"aaab", {"aab"}},                   // KMP fallback
    {"abababc", {"ababc"}},
    {"ab ab abc", {"abc", "ab c"}},
    {"aa", {"a", "aa"}},
    {"no stop here", {"stop!", "xyz"}},
    {"stop! stop!", {"stop!"}},
    {"a café! ok", {"é!"}},              // multi-byte stop string
    {"a café ok", {"é!"}},
    {"tail END", {"x", "END", "tail E"}},
};

TEST(StopStringMatcherTest, EverySplitGivesTheReferenceResultAndNeverEmitsTheStop) {
  for (const MatchCase& c : kMatchCases) {
    const auto [want_text, want_index] = ReferenceStop(c.text, c.stops);
    for (const std::vector<std::string>& deltas : AllSplits(c.text)) {
      StopStringMatcher m(c.stops);
      std::string emitted;
      bool matched = false;
      int index = -1;
      for (const std::string& d : deltas) {
        StopStringMatcher::Result r = m.Append(d);
        emitted += r.text;
        // Whatever came out so far is a prefix of the final text: no byte of the stop string (or
        // beyond it) is ever emitted.
        ASSERT_EQ(want_text.compare(0, emitted.size(), emitted), 0)
            << c.text << " emitted " << emitted << " split " << testing::PrintToString(deltas);
        ASSERT_LE(m.held_bytes(), m.max_holdback());
        if (r.matched) {
          matched = true;
          index = r.stop_index;
          break;
        }
      }
      if (!matched) emitted += m.Flush();
      EXPECT_EQ(emitted, want_text) << c.text << " split " << testing::PrintToString(deltas);
      EXPECT_EQ(index, want_index) << c.text << " split " << testing::PrintToString(deltas);
    }
  }
}

TEST(StopStringMatcherTest, TextBeforeTheStopIsEmittedAsSoonAsItIsSafe) {
  StopStringMatcher m({"END"});
  StopStringMatcher::Result r = m.Append("The E");
  EXPECT_EQ(r.text, "The ");
  EXPECT_FALSE(r.matched);
  EXPECT_EQ(m.held_bytes(), 1u);
  r = m.Append("NX");  // "ENX" cannot start END any more
  EXPECT_EQ(r.text, "ENX");
  r = m.Append("E");
  EXPECT_EQ(r.text, "");
  r = m.Append("ND.");
  EXPECT_TRUE(r.matched);
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(m.Append("more").text, "");  // nothing after a match
}

TEST(StopStringMatcherTest, HoldbackNeverExceedsLongestStopMinusOne) {
  const std::vector<std::string> stops = {"aaaa", "ab", "abcabcabd"};
  StopStringMatcher m(stops);
  EXPECT_EQ(m.max_holdback(), 8u);
  const std::string text = "aaabcabcabcabcabcaaa aaab abcabcab";
  for (char c : text) {
    StopStringMatcher::Result r = m.Append(std::string(1, c));
    ASSERT_LE(m.held_bytes(), 8u);
    if (r.matched) break;
  }
  StopStringMatcher none({});
  EXPECT_EQ(none.max_holdback(), 0u);
  EXPECT_EQ(none.Append("anything").text, "anything");
}

TEST(StopStringMatcherTest, NeverSplitsAMultiByteCharacter) {
  // Deltas are whole characters (what the detokenizer gives); every emitted chunk must be too.
  const std::vector<std::string> chars = {"c", "a", "f", "\xC3\xA9", " ", "\xC3\xA9", "\xE2\x82\xAC",
                                          "!", "\xF0\x9F\x98\x80", "x"};
  for (const std::vector<std::string>& stops :
       std::vector<std::vector<std::string>>{{"\xC3\xA9\xE2\x82\xAC?"}, {"\xF0\x9F\x98\x80y"}, {"f\xC3\xA9!"}}) {
    StopStringMatcher m(stops);
    std::string all;
    for (const std::string& c : chars) {
      const std::string out = m.Append(c).text;
      all += out;
      if (!out.empty()) {
        EXPECT_NE(static_cast<unsigned char>(out.front()) & 0xC0, 0x80) << "starts mid-character";
      }
      // The emitted text ends on a character boundary: it is a concatenation of whole deltas'
      // characters.
      std::string whole;
      bool boundary = all.empty();
      for (const std::string& d : chars) {
        whole += d;
        if (whole == all) boundary = true;
      }
      EXPECT_TRUE(boundary) << "emitted " << all;
    }
    all += m.Flush();
    std::string want;
    for (const std::string& c : chars) want += c;
    EXPECT_EQ(all, want);
  }
}

TEST(StopStringMatcherTest, MatchesEndingBeforeMinTokensDoNotCount) {
  StopStringMatcher m({"END", "ENDX"});
  StopStringMatcher::Result r = m.Append("an END", /*allow_match=*/false);
  EXPECT_FALSE(r.matched);
  EXPECT_EQ(r.text, "an ");  // "END" is still a prefix of "ENDX"
  r = m.Append("Y END", /*allow_match=*/true);
  EXPECT_TRUE(r.matched);
  EXPECT_EQ(r.text, "ENDY ");
}

StopChecker MakeChecker(const SamplingOptions& o, std::vector<int32_t> eos = {2},
                        int64_t prompt = 0, int64_t context = 0) {
  static std::vector<int32_t> eos_storage;
  eos_storage = std::move(eos);
  absl::StatusOr<StopChecker> c = StopChecker::Create(
      o, {.eos_token_ids = eos_storage, .prompt_tokens = prompt, .max_context = context});
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(c).value();
}

struct Step {
  int32_t token;
  std::string text;
};

// Runs the steps until a finish; returns (all emitted text, finish, tokens consumed).
struct Outcome {
  std::string text;
  FinishReason finish;
  int64_t tokens;
};

Outcome RunSteps(StopChecker& c, const std::vector<Step>& steps) {
  Outcome out{"", FinishReason::kNone, 0};
  for (const Step& s : steps) {
    StopStep r = c.Append(s.token, s.text);
    out.text += r.text;
    if (r.finish != FinishReason::kNone) {
      out.finish = r.finish;
      break;
    }
  }
  out.tokens = c.num_tokens();
  return out;
}

TEST(StopCheckerTest, FinishReasonsInVllmOrder) {
  // Token 2 is EOS, token 7 a stop token; "<eos>" / "<7>" stand for their (unemitted) text.
  const std::vector<Step> steps = {{10, "Hello"}, {11, " wor"}, {12, "ld"}, {7, "<7>"},
                                   {13, " and"},  {2, "<eos>"}, {14, " more"}};
  struct Case {
    const char* name;
    SamplingOptions options;
    Outcome want;
  };
  SamplingOptions plain;
  SamplingOptions with_stop_token;
  with_stop_token.stop_token_ids = {7};
  SamplingOptions ignore_eos;
  ignore_eos.ignore_eos = true;
  SamplingOptions min_tokens = with_stop_token;
  min_tokens.min_tokens = 5;
  SamplingOptions max_tokens;
  max_tokens.max_tokens = 3;
  SamplingOptions stop_at_max = with_stop_token;
  stop_at_max.max_tokens = 4;
  SamplingOptions string_at_max;
  string_at_max.max_tokens = 3;
  string_at_max.stop = {"rld"};
  SamplingOptions held_at_length;
  held_at_length.max_tokens = 2;
  held_at_length.stop = {"word"};
  SamplingOptions string_before_min;
  string_before_min.stop = {"wor"};
  string_before_min.min_tokens = 3;
  SamplingOptions string_across_min;
  string_across_min.stop = {"world"};
  string_across_min.min_tokens = 3;
  const Case cases[] = {
      {"EOS", plain, {"Hello world<7> and", FinishReason::kStop, 6}},
      {"stop token", with_stop_token, {"Hello world", FinishReason::kStop, 4}},
      {"ignore_eos", ignore_eos, {"Hello world<7> and<eos> more", FinishReason::kNone, 7}},
      {"min_tokens masks stop token", min_tokens, {"Hello world<7> and", FinishReason::kStop, 6}},
      {"max_tokens", max_tokens, {"Hello world", FinishReason::kLength, 3}},
      {"stop token beats length", stop_at_max, {"Hello world", FinishReason::kStop, 4}},
      {"stop string beats length", string_at_max, {"Hello wo", FinishReason::kStopString, 3}},
      {"length flushes held text", held_at_length, {"Hello wor", FinishReason::kLength, 2}},
      {"stop string before min_tokens", string_before_min,
       {"Hello world<7> and", FinishReason::kStop, 6}},
      {"stop string ending at min_tokens", string_across_min,
       {"Hello ", FinishReason::kStopString, 3}},
  };
  for (const Case& c : cases) {
    StopChecker checker = MakeChecker(c.options);
    const Outcome got = RunSteps(checker, steps);
    EXPECT_EQ(got.text, c.want.text) << c.name;
    EXPECT_EQ(got.finish, c.want.finish) << c.name;
    EXPECT_EQ(got.tokens, c.want.tokens) << c.name;
  }
}

TEST(StopCheckerTest, ContextLimitIsLength) {
  StopChecker c = MakeChecker({}, {2}, /*prompt=*/8, /*context=*/10);
  EXPECT_EQ(c.Append(5, "a").finish, FinishReason::kNone);
  const StopStep last = c.Append(5, "b");
  EXPECT_EQ(last.finish, FinishReason::kLength);
  EXPECT_EQ(last.text, "b");
  // After a finish nothing changes.
  const StopStep after = c.Append(5, "c");
  EXPECT_EQ(after.finish, FinishReason::kLength);
  EXPECT_EQ(after.text, "");
  EXPECT_EQ(c.num_tokens(), 2);
}

TEST(StopCheckerTest, FlushReleasesHeldTextOnAnOutsideFinish) {
  SamplingOptions o;
  o.stop = {"###"};
  StopChecker c = MakeChecker(o);
  EXPECT_EQ(c.Append(5, "done #").text, "done ");
  EXPECT_EQ(c.Append(5, "#").text, "");
  EXPECT_EQ(c.Flush(), "##");
}

TEST(StopCheckerTest, BadOptionsAreInvalidArgument) {
  SamplingOptions o;
  o.stop = {""};
  EXPECT_EQ(StopChecker::Create(o, {}).status().code(), absl::StatusCode::kInvalidArgument);
  o.stop = {};
  o.max_tokens = 0;
  EXPECT_EQ(StopChecker::Create(o, {}).status().code(), absl::StatusCode::kInvalidArgument);
  o.max_tokens = 100;
  EXPECT_EQ(StopChecker::Create(o, {.max_context = 50}).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> eos = {-1};
  EXPECT_EQ(StopChecker::Create({}, {.eos_token_ids = eos}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(FinishReasonTest, ValuesMatchTheProto) {
  EXPECT_EQ(static_cast<int>(FinishReason::kNone), 0);
  EXPECT_EQ(static_cast<int>(FinishReason::kStop), 1);
  EXPECT_EQ(static_cast<int>(FinishReason::kStopString), 2);
  EXPECT_EQ(static_cast<int>(FinishReason::kLength), 3);
  EXPECT_EQ(static_cast<int>(FinishReason::kCancelled), 4);
  EXPECT_EQ(static_cast<int>(FinishReason::kError), 5);
  EXPECT_EQ(FinishReasonName(FinishReason::kStopString), "stop_string");
}

}  // namespace
}  // namespace tandem::sampling
