#include "engine/model/safetensors.h"

#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

constexpr char kName[] = "model.safetensors";

struct TestTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string data;
};

// Writes tensors back to back in the given order, with `header_edit` applied to the JSON header.
std::string BuildSafetensors(const std::vector<TestTensor>& tensors,
                             const std::function<void(json*)>& header_edit = nullptr) {
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};
  std::string data;
  for (const TestTensor& t : tensors) {
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {data.size(), data.size() + t.data.size()}}};
    data += t.data;
  }
  if (header_edit) header_edit(&header);
  const std::string text = header.dump();
  std::string out(8, '\0');
  const uint64_t n = text.size();
  std::memcpy(out.data(), &n, 8);
  return out + text + data;
}

std::string Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

std::vector<TestTensor> SampleTensors() {
  return {
      {"empty", "F32", {0, 4}, ""},
      {"model.embed_tokens.weight", "BF16", {5, 8}, Random(80, 1)},
      {"model.norm.weight", "F32", {8}, Random(32, 2)},
      {"scalar", "F16", {}, Random(2, 3)},
      {"lm_head.weight", "F16", {5, 8}, Random(80, 4)},
  };
}

TEST(SafetensorsTest, RoundTripsTensorsAndMetadata) {
  const std::vector<TestTensor> tensors = SampleTensors();
  auto f = SafetensorsFile::FromBytes(BuildSafetensors(tensors), kName);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
  ASSERT_EQ((*f)->tensors().size(), tensors.size());
  for (size_t i = 1; i < (*f)->tensors().size(); ++i) {
    EXPECT_LT((*f)->tensors()[i - 1].name, (*f)->tensors()[i].name);
  }
  for (const TestTensor& want : tensors) {
    SCOPED_TRACE(want.name);
    const SafetensorsTensor* t = (*f)->FindTensor(want.name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(DTypeName(t->type), want.dtype);
    EXPECT_EQ(t->shape, want.shape);
    EXPECT_EQ(t->bytes, static_cast<int64_t>(want.data.size()));
    EXPECT_EQ(std::memcmp(t->data, want.data.data(), want.data.size()), 0);
    EXPECT_GE(t->file_offset, (*f)->data_offset());
  }
  EXPECT_EQ((*f)->FindTensor("absent"), nullptr);
}

TEST(SafetensorsTest, EveryTruncationIsDataLoss) {
  const std::string bytes = BuildSafetensors(SampleTensors());
  for (size_t len = 0; len < bytes.size(); ++len) {
    absl::Status s =
        SafetensorsFile::FromBytes(absl::string_view(bytes).substr(0, len), kName).status();
    ASSERT_EQ(s.code(), absl::StatusCode::kDataLoss) << "length " << len << ": " << s;
    ASSERT_THAT(s.message(), HasSubstr(kName));
  }
}

TEST(SafetensorsTest, HostileHeadersAreRejected) {
  using C = absl::StatusCode;
  struct Case {
    std::string name;
    std::function<std::string()> build;
    C code;
    std::string substring;
  };
  const std::vector<TestTensor> tensors = SampleTensors();
  auto edit = [tensors](std::function<void(json*)> e) {
    return [tensors, e] { return BuildSafetensors(tensors, e); };
  };
  auto raw_header = [](const std::string& text) {
    return [text] {
      std::string out(8, '\0');
      const uint64_t n = text.size();
      std::memcpy(out.data(), &n, 8);
      return out + text;
    };
  };
  const Case cases[] = {
      {"header size huge",
       [] { return std::string("\xff\xff\xff\xff\xff\xff\xff\x7f{}", 10); }, C::kInvalidArgument,
       "exceeds the limit"},
      {"not json", raw_header("{\"a\": "), C::kInvalidArgument, "not a JSON object"},
      {"json array", raw_header("[1, 2]"), C::kInvalidArgument, "not a JSON object"},
      {"invalid utf-8", raw_header("{\"\xff\": 1}"), C::kInvalidArgument, "not a JSON object"},
      {"entry not object", edit([](json* h) { (*h)["model.norm.weight"] = 3; }),
       C::kInvalidArgument, "'model.norm.weight': entry is not an object"},
      {"missing dtype", edit([](json* h) { (*h)["model.norm.weight"].erase("dtype"); }),
       C::kInvalidArgument, "'dtype'"},
      {"unknown dtype", edit([](json* h) { (*h)["model.norm.weight"]["dtype"] = "Q9"; }),
       C::kInvalidArgument, "unknown dtype 'Q9'"},
      {"unsupported dtype", edit([](json* h) { (*h)["model.norm.weight"]["dtype"] = "I32"; }),
       C::kUnimplemented, "I32"},
      {"negative dim", edit([](json* h) { (*h)["model.norm.weight"]["shape"] = {-8}; }),
       C::kInvalidArgument, "non-negative integers"},
      {"float dim", edit([](json* h) { (*h)["model.norm.weight"]["shape"] = {8.5}; }),
       C::kInvalidArgument, "non-negative integers"},
      {"dims overflow",
       edit([](json* h) {
         (*h)["model.norm.weight"]["shape"] = {1ll << 40, 1ll << 40};
       }),
       C::kInvalidArgument, "overflows"},
      {"offsets reversed",
       edit([](json* h) { (*h)["model.norm.weight"]["data_offsets"] = {200, 168}; }),
       C::kInvalidArgument, "begin <= end"},
      {"offsets one entry", edit([](json* h) { (*h)["model.norm.weight"]["data_offsets"] = {0}; }),
       C::kInvalidArgument, "[begin, end]"},
      {"span mismatch", edit([](json* h) { (*h)["model.norm.weight"]["shape"] = {4}; }),
       C::kInvalidArgument, "needs 16"},
      {"offsets past end",
       edit([](json* h) { (*h)["model.norm.weight"]["data_offsets"] = {1000, 1032}; }),
       C::kDataLoss, "runs past"},
      {"overlap",
       edit([](json* h) { (*h)["model.norm.weight"]["data_offsets"] = {0, 32}; }),
       C::kInvalidArgument, "overlaps"},
      {"metadata not strings", edit([](json* h) { (*h)["__metadata__"]["n"] = 1; }),
       C::kInvalidArgument, "__metadata__ key 'n'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    absl::Status s = SafetensorsFile::FromBytes(c.build(), kName).status();
    EXPECT_EQ(s.code(), c.code) << s;
    EXPECT_THAT(s.message(), HasSubstr(kName)) << s;
    EXPECT_THAT(s.message(), HasSubstr(c.substring)) << s;
  }
}

}  // namespace
}  // namespace tandem
