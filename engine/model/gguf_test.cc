#include "engine/model/gguf.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model/gguf_test_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::tandem::testing::AppendLE;
using ::tandem::testing::Arr;
using ::tandem::testing::Bool;
using ::tandem::testing::F32;
using ::tandem::testing::F64;
using ::tandem::testing::GgufTestLayout;
using ::tandem::testing::GgufTestWriter;
using ::tandem::testing::I16;
using ::tandem::testing::I32;
using ::tandem::testing::I64;
using ::tandem::testing::I8;
using ::tandem::testing::StoreLE;
using ::tandem::testing::Str;
using ::tandem::testing::StrArr;
using ::tandem::testing::U16;
using ::tandem::testing::U32;
using ::tandem::testing::U64;
using ::tandem::testing::U8;
using ::testing::HasSubstr;

constexpr char kName[] = "test.gguf";

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng() & 0xFF);
  return s;
}

// Random storage for `type` with finite scales (quantized blocks get sane f16 scales).
std::string RandomTensorData(DType type, int64_t elements, uint32_t seed) {
  const int64_t bytes = *DTypeStorageBytes(type, elements);
  std::string s = RandomBytes(static_cast<size_t>(bytes), seed);
  std::mt19937 rng(seed + 1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  if (type == DType::kF32) {
    for (int64_t i = 0; i < elements; ++i) StoreLE<float>(&s, i * 4, dist(rng));
  } else if (type == DType::kF16) {
    for (int64_t i = 0; i < elements; ++i) StoreLE<uint16_t>(&s, i * 2, FloatToHalf(dist(rng)));
  } else if (type == DType::kBF16) {
    for (int64_t i = 0; i < elements; ++i) {
      StoreLE<uint16_t>(&s, i * 2, FloatToBFloat16(dist(rng)));
    }
  } else {
    const int64_t block_bytes = DTypeBlockBytes(type);
    for (int64_t b = 0; b < bytes / block_bytes; ++b) {
      StoreLE<uint16_t>(&s, b * block_bytes, FloatToHalf(dist(rng) * 0.1f));
      if (type == DType::kQ4_1) StoreLE<uint16_t>(&s, b * block_bytes + 2, FloatToHalf(dist(rng)));
    }
  }
  return s;
}

// A small valid file with metadata of every kind and one tensor per DType.
GgufTestWriter ValidWriter() {
  GgufTestWriter w;
  w.Add("general.architecture", Str("llama"));
  w.Add("a.u8", U8(200));
  w.Add("a.bool", Bool(true));
  w.Add("a.strings", StrArr({"x", "yz"}));
  w.Add("a.i32s", Arr(GgufValueType::kInt32, {I32(-1), I32(7)}));
  w.Add("a.nested", Arr(GgufValueType::kArray, {Arr(GgufValueType::kUint8, {U8(1)})}));
  w.Add("a.f32", F32(0.5f));
  uint32_t seed = 1;
  for (DType t : kAllDTypes) {
    const int64_t row = std::max<int64_t>(32, DTypeBlockElements(t));
    w.AddTensor(absl::StrCat("t.", DTypeName(t)), t, {row, 2}, RandomTensorData(t, 2 * row, seed++));
  }
  return w;
}

TEST(GgufTest, RoundTripsEveryMetadataType) {
  GgufTestWriter w;
  w.Add("u8", U8(255));
  w.Add("i8", I8(-128));
  w.Add("u16", U16(65535));
  w.Add("i16", I16(-32768));
  w.Add("u32", U32(4294967295u));
  w.Add("i32", I32(-2147483647 - 1));
  w.Add("u64", U64(std::numeric_limits<uint64_t>::max()));
  w.Add("i64", I64(std::numeric_limits<int64_t>::min()));
  w.Add("f32", F32(-1.5f));
  w.Add("f64", F64(1e300));
  w.Add("t", Bool(true));
  w.Add("f", Bool(false));
  w.Add("s", Str(std::string("h\xC3\xA9llo\0x", 8)));
  w.Add("empty", Str(""));
  w.Add("small.u32", U32(7));
  w.Add("small.i64", I64(42));
  w.Add("neg.i32", I32(-3));
  w.Add("strings", StrArr({"a", "", "\xE2\x82\xAC"}));
  w.Add("floats", Arr(GgufValueType::kFloat32, {F32(1.0f), F32(-2.25f)}));
  w.Add("doubles", Arr(GgufValueType::kFloat64, {F64(0.125)}));
  w.Add("ints", Arr(GgufValueType::kInt32, {I32(-5), I32(0), I32(2147483647)}));
  w.Add("u8s", Arr(GgufValueType::kUint8, {U8(0), U8(9)}));
  w.Add("i16s", Arr(GgufValueType::kInt16, {I16(-7)}));
  w.Add("u16s", Arr(GgufValueType::kUint16, {U16(65535)}));
  w.Add("i8s", Arr(GgufValueType::kInt8, {I8(-1)}));
  w.Add("u64s", Arr(GgufValueType::kUint64, {U64(1ull << 40)}));
  w.Add("i64s", Arr(GgufValueType::kInt64, {I64(-(1ll << 40))}));
  w.Add("bools", Arr(GgufValueType::kBool, {Bool(true), Bool(false)}));
  w.Add("big.u32s", Arr(GgufValueType::kUint32, {U32(4000000000u)}));
  w.Add("empty.arr", Arr(GgufValueType::kString, {}));
  w.Add("nested", Arr(GgufValueType::kArray, {Arr(GgufValueType::kInt32, {I32(1), I32(2)}),
                                               Arr(GgufValueType::kString, {Str("q")})}));
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::FromBytes(w.Build(), kName);
  ASSERT_TRUE(file.ok()) << file.status();
  const GgufFile& f = **file;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32);
  EXPECT_EQ(f.metadata().size(), 31u);
  EXPECT_EQ(f.metadata()[0].key, "u8");
  EXPECT_TRUE(f.tensors().empty());

  EXPECT_EQ(*f.GetUint32("u8"), 255u);
  EXPECT_EQ(*f.Find("i8")->AsInt64(), -128);
  EXPECT_EQ(*f.GetUint32("u16"), 65535u);
  EXPECT_EQ(*f.GetInt64("i16"), -32768);
  EXPECT_EQ(*f.GetUint32("u32"), 4294967295u);
  EXPECT_EQ(*f.GetInt64("i32"), -2147483648ll);
  EXPECT_EQ(*f.GetUint64("u64"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(*f.GetInt64("i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(*f.GetFloat32("f32"), -1.5f);
  EXPECT_EQ(*f.Find("f64")->AsFloat64(), 1e300);
  EXPECT_TRUE(*f.GetBool("t"));
  EXPECT_FALSE(*f.GetBool("f"));
  EXPECT_EQ(*f.GetString("s"), absl::string_view("h\xC3\xA9llo\0x", 8));
  EXPECT_EQ(*f.GetString("empty"), "");
  EXPECT_EQ(*f.GetUint32("small.i64"), 42u);  // any integer type that fits
  EXPECT_EQ(*f.GetInt64("small.u32"), 7);
  EXPECT_THAT(*f.GetStringArray("strings"),
              ::testing::ElementsAre("a", "", "\xE2\x82\xAC"));
  EXPECT_THAT(*f.GetFloat32Array("floats"), ::testing::ElementsAre(1.0f, -2.25f));
  EXPECT_THAT(*f.GetFloat32Array("doubles"), ::testing::ElementsAre(0.125f));
  EXPECT_THAT(*f.GetInt32Array("ints"), ::testing::ElementsAre(-5, 0, 2147483647));
  EXPECT_THAT(*f.GetInt32Array("u8s"), ::testing::ElementsAre(0, 9));
  EXPECT_THAT(*f.GetInt32Array("i16s"), ::testing::ElementsAre(-7));
  EXPECT_THAT(*f.GetInt32Array("u16s"), ::testing::ElementsAre(65535));
  EXPECT_THAT(*f.GetInt32Array("i8s"), ::testing::ElementsAre(-1));
  EXPECT_EQ(*f.Find("u64s")->element(0).AsUint64(), 1ull << 40);
  EXPECT_EQ(*f.Find("i64s")->element(0).AsInt64(), -(1ll << 40));
  EXPECT_TRUE(*f.Find("bools")->element(0).AsBool());
  EXPECT_FALSE(*f.Find("bools")->element(1).AsBool());
  EXPECT_TRUE(f.GetStringArray("empty.arr")->empty());
  const GgufValue* nested = f.Find("nested");
  ASSERT_NE(nested, nullptr);
  ASSERT_EQ(nested->element_type(), GgufValueType::kArray);
  ASSERT_EQ(nested->size(), 2);
  EXPECT_EQ(*nested->element(0).element(1).AsInt64(), 2);
  EXPECT_EQ(*nested->element(1).element(0).AsString(), "q");
  EXPECT_TRUE(f.Has("nested"));
  EXPECT_FALSE(f.Has("nope"));
  EXPECT_EQ(f.Find("nope"), nullptr);
}

TEST(GgufTest, TypedAccessorErrorsNameKeyAndTypes) {
  GgufTestWriter w;
  w.Add("s", Str("x"));
  w.Add("neg", I32(-3));
  w.Add("big", U64(1ull << 33));
  w.Add("huge", U64(std::numeric_limits<uint64_t>::max()));
  w.Add("f", F32(1.0f));
  w.Add("ints", Arr(GgufValueType::kInt32, {I32(1)}));
  w.Add("big.ints", Arr(GgufValueType::kUint32, {U32(4000000000u)}));
  auto f = GgufFile::FromBytes(w.Build(), kName);
  ASSERT_TRUE(f.ok()) << f.status();
  struct Case {
    absl::Status status;
    absl::StatusCode code;
    std::vector<std::string> substrings;
  };
  const Case cases[] = {
      {(*f)->GetUint32("missing").status(), absl::StatusCode::kNotFound, {"'missing'", kName}},
      {(*f)->GetUint32("s").status(), absl::StatusCode::kInvalidArgument,
       {"'s'", "expected an integer", "got string"}},
      {(*f)->GetUint32("neg").status(), absl::StatusCode::kInvalidArgument, {"'neg'", "-3"}},
      {(*f)->GetUint32("big").status(), absl::StatusCode::kInvalidArgument,
       {"'big'", "does not fit in uint32"}},
      {(*f)->GetInt64("huge").status(), absl::StatusCode::kInvalidArgument, {"'huge'", "int64"}},
      {(*f)->GetString("f").status(), absl::StatusCode::kInvalidArgument,
       {"'f'", "expected string", "got float32"}},
      {(*f)->GetFloat32("s").status(), absl::StatusCode::kInvalidArgument, {"float32 or float64"}},
      {(*f)->GetBool("f").status(), absl::StatusCode::kInvalidArgument, {"expected bool"}},
      {(*f)->GetStringArray("ints").status(), absl::StatusCode::kInvalidArgument,
       {"'ints'", "expected array of string", "got array of int32"}},
      {(*f)->GetFloat32Array("s").status(), absl::StatusCode::kInvalidArgument, {"got string"}},
      {(*f)->GetInt32Array("big.ints").status(), absl::StatusCode::kInvalidArgument,
       {"'big.ints'", "element 0", "int32"}},
  };
  for (size_t i = 0; i < std::size(cases); ++i) {
    SCOPED_TRACE(absl::StrCat("case ", i, ": ", cases[i].status.ToString()));
    EXPECT_EQ(cases[i].status.code(), cases[i].code);
    for (const std::string& sub : cases[i].substrings) {
      EXPECT_THAT(cases[i].status.message(), HasSubstr(sub));
    }
  }
}

TEST(GgufTest, TensorsOfEveryTypeRoundTrip) {
  for (uint32_t version : {2u, 3u}) {
    for (int64_t alignment : {1, 32, 64, 4096}) {
      SCOPED_TRACE(absl::StrCat("version ", version, " alignment ", alignment));
      GgufTestWriter w;
      w.set_version(version);
      w.set_alignment(alignment);
      if (alignment != 32) w.Add("general.alignment", U32(static_cast<uint32_t>(alignment)));
      std::vector<std::string> data;
      const std::vector<std::vector<int64_t>> shapes = {{32}, {64, 3}, {32, 2, 2}, {32, 1, 1, 3}};
      // ne[0] in whole blocks of 32 or, for the K-quants, 256 elements.
      auto shape_of = [&](DType t, size_t s) {
        std::vector<int64_t> shape = shapes[s];
        shape[0] *= std::max<int64_t>(1, DTypeBlockElements(t) / 32);
        return shape;
      };
      uint32_t seed = 100;
      for (DType t : kAllDTypes) {
        for (size_t s = 0; s < shapes.size(); ++s) {
          int64_t n = 1;
          for (int64_t d : shape_of(t, s)) n *= d;
          data.push_back(RandomTensorData(t, n, seed++));
          w.AddTensor(absl::StrCat(DTypeName(t), ".", s), t, shape_of(t, s), data.back());
        }
      }
      GgufTestLayout layout;
      const std::string bytes = w.Build(&layout);
      auto f = GgufFile::FromBytes(bytes, kName);
      ASSERT_TRUE(f.ok()) << f.status();
      EXPECT_EQ((*f)->version(), version);
      EXPECT_EQ((*f)->alignment(), alignment);
      EXPECT_EQ((*f)->data_offset(), layout.data_offset);
      ASSERT_EQ((*f)->tensors().size(), data.size());
      size_t i = 0;
      for (DType t : kAllDTypes) {
        for (size_t s = 0; s < shapes.size(); ++s, ++i) {
          const GgufTensor* tensor = (*f)->FindTensor(absl::StrCat(DTypeName(t), ".", s));
          ASSERT_NE(tensor, nullptr);
          EXPECT_EQ(tensor, &(*f)->tensors()[i]);
          EXPECT_EQ(tensor->type, t);
          EXPECT_EQ(tensor->shape, shape_of(t, s));
          EXPECT_EQ(tensor->bytes, static_cast<int64_t>(data[i].size()));
          EXPECT_EQ(tensor->file_offset, layout.tensors[i].data_at);
          EXPECT_EQ(tensor->file_offset % alignment, 0);
          EXPECT_EQ(std::memcmp(tensor->data, data[i].data(), data[i].size()), 0);
        }
      }
      EXPECT_EQ((*f)->FindTensor("absent"), nullptr);
    }
  }
}

TEST(GgufTest, OpenMapsAFileAndReportsFileSystemErrors) {
  const std::string dir = ::testing::TempDir();
  const std::string path = absl::StrCat(dir, "/gguf_test_open_", getpid(), ".gguf");
  const std::string bytes = ValidWriter().Build();
  {
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  auto opened = GgufFile::Open(path);
  ASSERT_TRUE(opened.ok()) << opened.status();
  auto copied = GgufFile::FromBytes(bytes, path);
  ASSERT_TRUE(copied.ok()) << copied.status();
  ASSERT_EQ((*opened)->tensors().size(), (*copied)->tensors().size());
  for (size_t i = 0; i < (*opened)->tensors().size(); ++i) {
    const GgufTensor& a = (*opened)->tensors()[i];
    const GgufTensor& b = (*copied)->tensors()[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.file_offset, b.file_offset);
    EXPECT_EQ(std::memcmp(a.data, b.data, static_cast<size_t>(a.bytes)), 0);
  }
  EXPECT_EQ(*(*opened)->GetString("general.architecture"), "llama");

  // Truncated on disk: DATA_LOSS naming the file.
  std::filesystem::resize_file(path, bytes.size() - 1);
  absl::Status s = GgufFile::Open(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr(path));
  std::filesystem::resize_file(path, 0);
  s = GgufFile::Open(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  std::filesystem::remove(path);

  s = GgufFile::Open(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(s.message(), HasSubstr(path));
  s = GgufFile::Open(dir).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

TEST(GgufTest, EveryTruncationIsDataLoss) {
  const std::string bytes = ValidWriter().Build();
  ASSERT_TRUE(GgufFile::FromBytes(bytes, kName).ok());
  for (size_t len = 0; len < bytes.size(); ++len) {
    absl::Status s = GgufFile::FromBytes(absl::string_view(bytes).substr(0, len), kName).status();
    ASSERT_EQ(s.code(), absl::StatusCode::kDataLoss) << "length " << len << ": " << s;
    ASSERT_THAT(s.message(), HasSubstr(kName));
    ASSERT_THAT(s.message(), HasSubstr("offset"));
  }
}

// One corruption of a valid file (or a file built differently) and the error it must give.
struct BadFileCase {
  std::string name;
  std::function<std::string()> build;
  absl::StatusCode code;
  std::vector<std::string> substrings;
};

std::vector<BadFileCase> BadFileCases() {
  GgufTestLayout l;
  const std::string valid = ValidWriter().Build(&l);
  auto kv = [l](const std::string& key) {
    for (const auto& k : l.kvs) {
      if (k.key == key) return k;
    }
    std::abort();  // test bug
  };
  // `valid` with a T stored at `at`.
  auto patch = [valid](int64_t at, auto value) {
    return [valid, at, value] {
      std::string s = valid;
      StoreLE(&s, at, value);
      return s;
    };
  };
  auto built = [](std::function<void(GgufTestWriter*)> edit) {
    return [edit] {
      GgufTestWriter w;
      edit(&w);
      return w.Build();
    };
  };
  const auto& t0 = l.tensors[0];
  const auto& t1 = l.tensors[1];
  using C = absl::StatusCode;
  constexpr uint64_t kHuge = std::numeric_limits<uint64_t>::max();
  return {
      {"bad magic", patch(0, uint32_t{0x46554746}), C::kInvalidArgument, {"magic", "offset 0"}},
      {"version 1", patch(4, uint32_t{1}), C::kUnimplemented, {"version 1"}},
      {"version 4", patch(4, uint32_t{4}), C::kInvalidArgument, {"version 4"}},
      {"big-endian", patch(4, uint32_t{0x03000000}), C::kUnimplemented, {"big-endian"}},
      {"tensor_count huge", patch(l.tensor_count_at, kHuge), C::kDataLoss, {"tensor_count"}},
      // The extra tensor's name is read from the first tensor's data: a length past the end.
      {"tensor_count + 1", patch(l.tensor_count_at, uint64_t{l.tensors.size() + 1}),
       C::kDataLoss, {"name", "exceeds"}},
      {"kv_count huge", patch(l.kv_count_at, uint64_t{1} << 62), C::kDataLoss,
       {"metadata_kv_count"}},
      {"key length huge", patch(kv("a.u8").key_at, kHuge), C::kDataLoss,
       {"metadata key #1", "string length"}},
      {"string value length huge", patch(kv("general.architecture").value_at, kHuge),
       C::kDataLoss, {"'general.architecture'"}},
      {"string element length huge", patch(kv("a.strings").value_at + 12, uint64_t{1} << 40),
       C::kDataLoss, {"'a.strings' element 0"}},
      {"array count huge", patch(kv("a.i32s").value_at + 4, kHuge / 2), C::kDataLoss,
       {"'a.i32s'", "cannot fit"}},
      {"nested array count huge", patch(kv("a.nested").value_at + 16, uint64_t{1} << 50),
       C::kDataLoss, {"'a.nested'"}},
      {"unknown value type", patch(kv("a.u8").type_at, uint32_t{13}), C::kInvalidArgument,
       {"'a.u8'", "unknown value type 13"}},
      {"unknown element type", patch(kv("a.i32s").value_at, uint32_t{99}), C::kInvalidArgument,
       {"'a.i32s'", "unknown array element type 99"}},
      {"bool value 2", patch(kv("a.bool").value_at, uint8_t{2}), C::kInvalidArgument,
       {"'a.bool'", "neither 0 nor 1"}},
      {"n_dims 0", patch(t0.n_dims_at, uint32_t{0}), C::kInvalidArgument,
       {"tensor 't.F32'", "0 dimensions"}},
      {"n_dims 5", patch(t0.n_dims_at, uint32_t{5}), C::kInvalidArgument, {"5 dimensions"}},
      {"dim 0", patch(t0.dims_at + 8, uint64_t{0}), C::kInvalidArgument,
       {"tensor 't.F32'", "dimension 1 is 0"}},
      {"dim overflow", patch(t0.dims_at, uint64_t{1} << 62), C::kInvalidArgument,
       {"overflows"}},
      {"dim past end", patch(t0.dims_at, uint64_t{1} << 20), C::kDataLoss,
       {"'t.F32'", "past the end"}},
      {"unknown type id", patch(t0.type_at, uint32_t{99}), C::kInvalidArgument,
       {"'t.F32'", "99"}},
      {"unsupported type Q3_K", patch(t0.type_at, uint32_t{11}), C::kUnimplemented,
       {"'t.F32'", "Q3_K"}},
      {"row not whole super-blocks", patch(t0.type_at, uint32_t{12}), C::kInvalidArgument,
       {"'t.F32'", "Q4_K block size 256"}},
      {"offset past end", patch(t1.offset_at, uint64_t{1} << 40), C::kDataLoss,
       {"tensor 't.F16' data offset", "past the end"}},
      {"offset huge", patch(t1.offset_at, kHuge - 31), C::kDataLoss, {"'t.F16'"}},
      {"offset misaligned", patch(t1.offset_at, t1.offset + 8), C::kInvalidArgument,
       {"'t.F16'", "not a multiple of the alignment 32"}},
      {"offsets overlap", patch(t1.offset_at, t0.offset), C::kInvalidArgument, {"overlaps"}},
      {"duplicate tensor name",
       [valid, l] {
         std::string s = valid;
         s[l.tensors[1].name_at + 8 + 2] = 'F';  // "t.F16" -> "t.F32"
         s[l.tensors[1].name_at + 8 + 3] = '3';
         s[l.tensors[1].name_at + 8 + 4] = '2';
         return s;
       },
       C::kInvalidArgument, {"'t.F32'", "duplicate tensor name"}},
      {"alignment 3", built([](GgufTestWriter* w) { w->Add("general.alignment", U32(3)); }),
       C::kInvalidArgument, {"general.alignment", "power-of-two", "3"}},
      {"alignment 0", built([](GgufTestWriter* w) { w->Add("general.alignment", U32(0)); }),
       C::kInvalidArgument, {"general.alignment"}},
      {"alignment string",
       built([](GgufTestWriter* w) { w->Add("general.alignment", Str("32")); }),
       C::kInvalidArgument, {"general.alignment", "string"}},
      {"duplicate key",
       built([](GgufTestWriter* w) {
         w->Add("k", U8(1));
         w->Add("k", U8(2));
       }),
       C::kInvalidArgument, {"'k'", "duplicate key"}},
      {"empty key", built([](GgufTestWriter* w) { w->Add("", U8(1)); }), C::kInvalidArgument,
       {"empty key"}},
      {"arrays nested too deep",
       built([](GgufTestWriter* w) {
         auto v = Arr(GgufValueType::kUint8, {U8(1)});
         for (int i = 0; i < 8; ++i) v = Arr(GgufValueType::kArray, {v});
         w->Add("deep", v);
       }),
       C::kInvalidArgument, {"'deep'", "nested deeper"}},
      {"quantized row not whole blocks",
       built([](GgufTestWriter* w) {
         w->AddTensor("q", DType::kQ4_0, {16, 2}, std::string(18, '\0'));
       }),
       C::kInvalidArgument, {"'q'", "block size 32"}},
      {"empty tensor name",
       built([](GgufTestWriter* w) { w->AddZeroTensor("", DType::kF32, {4}); }),
       C::kInvalidArgument, {"tensor #0", "empty name"}},
  };
}

TEST(GgufTest, HostileHeadersAreRejectedWithTheRightCode) {
  for (const BadFileCase& c : BadFileCases()) {
    SCOPED_TRACE(c.name);
    absl::Status s = GgufFile::FromBytes(c.build(), kName).status();
    EXPECT_EQ(s.code(), c.code) << s;
    EXPECT_THAT(s.message(), HasSubstr(kName)) << s;
    for (const std::string& sub : c.substrings) EXPECT_THAT(s.message(), HasSubstr(sub)) << s;
  }
}

TEST(GgufTest, NestedArraysAtTheDepthLimitParse) {
  GgufTestWriter w;
  auto v = Arr(GgufValueType::kUint8, {U8(1)});
  for (int i = 0; i < 7; ++i) v = Arr(GgufValueType::kArray, {v});
  w.Add("deep", v);
  auto f = GgufFile::FromBytes(w.Build(), kName);
  ASSERT_TRUE(f.ok()) << f.status();
  GgufValue e = *(*f)->Find("deep");
  for (int i = 0; i < 7; ++i) e = e.element(0);
  EXPECT_EQ(*e.element(0).AsUint64(), 1u);
}

TEST(GgufTest, RandomCorruptionNeverCrashes) {
  GgufTestLayout l;
  const std::string valid = ValidWriter().Build(&l);
  std::mt19937 rng(12345);
  int rejected = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string s = valid;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) {
      // Mostly the header and directory, where the parser makes its decisions.
      const size_t at = rng() % static_cast<uint64_t>(l.data_offset);
      s[at] = static_cast<char>(rng() % 3 == 0 ? 0xFF : rng() & 0xFF);
    }
    absl::StatusOr<std::unique_ptr<GgufFile>> f = GgufFile::FromBytes(s, kName);
    if (!f.ok()) {
      ++rejected;
      EXPECT_THAT(f.status().code(),
                  ::testing::AnyOf(absl::StatusCode::kInvalidArgument,
                                   absl::StatusCode::kDataLoss, absl::StatusCode::kUnimplemented))
          << f.status();
      continue;
    }
    // What parses must be self-consistent: every tensor inside the file.
    for (const GgufTensor& t : (*f)->tensors()) {
      EXPECT_GE(t.file_offset, (*f)->data_offset());
      EXPECT_LE(t.file_offset + t.bytes, static_cast<int64_t>(s.size()));
    }
  }
  EXPECT_GT(rejected, 1000);
}

}  // namespace
}  // namespace tandem
