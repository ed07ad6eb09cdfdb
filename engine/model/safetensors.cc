#include "engine/model/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using nlohmann::json;

// Safetensors dtype names Tandem reads, and the ones it knows but does not.
absl::StatusOr<DType> DTypeFromSafetensors(const std::string& name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  static constexpr const char* kKnown[] = {"F64", "I64", "U64", "I32", "U32", "I16", "U16",
                                           "I8",  "U8",  "BOOL", "F8_E4M3", "F8_E5M2"};
  for (const char* k : kKnown) {
    if (name == k) {
      return absl::UnimplementedError(absl::StrCat(
          "dtype ", name, " is not supported (supported: F32, F16, BF16)"));
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", name, "'"));
}

// A non-negative integer that fits in int64, or nullopt.
std::optional<int64_t> NonNegativeInt(const json& j) {
  if (j.is_number_unsigned()) {
    const uint64_t v = j.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(v);
  }
  if (j.is_number_integer()) {
    const int64_t v = j.get<int64_t>();
    if (v < 0) return std::nullopt;
    return v;
  }
  return std::nullopt;
}

}  // namespace

int64_t SafetensorsTensor::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // overflow excluded by the parser
  return n;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  ASSIGN_OR_RETURN(MappedFile bytes, MappedFile::Open(path));
  return Parse(std::move(bytes));
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromBytes(
    absl::string_view bytes, const std::string& name) {
  return Parse(MappedFile::Copy(bytes, name));
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Parse(MappedFile bytes) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile(std::move(bytes)));
  RETURN_IF_ERROR(file->ParseHeader());
  return file;
}

const SafetensorsTensor* SafetensorsFile::FindTensor(absl::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

absl::Status SafetensorsFile::ParseHeader() {
  const std::string& path = bytes_.path();
  const int64_t size = bytes_.size();
  if (size < 8) {
    return absl::DataLossError(absl::StrCat(path, ": header size at offset 0: file truncated (",
                                            size, " bytes, needs 8)"));
  }
  uint64_t header_size;
  std::memcpy(&header_size, bytes_.data(), sizeof(header_size));
  if (header_size > static_cast<uint64_t>(kMaxHeaderBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header size at offset 0: ",
                                                   header_size, " bytes exceeds the limit of ",
                                                   kMaxHeaderBytes));
  }
  if (header_size > static_cast<uint64_t>(size - 8)) {
    return absl::DataLossError(absl::StrCat(path, ": header at offset 8: file truncated (header of ",
                                            header_size, " bytes, ", size - 8, " left)"));
  }
  data_offset_ = 8 + static_cast<int64_t>(header_size);
  const char* text = reinterpret_cast<const char*>(bytes_.data()) + 8;
  const json header = json::parse(text, text + header_size, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": header at offset 8: not a JSON object"));
  }
  const int64_t data_size = size - data_offset_;
  struct Span {
    int64_t begin, end;
    size_t tensor;
  };
  std::vector<Span> spans;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": __metadata__ is not an object"));
      }
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat(path, ": __metadata__ key '", k, "' is not a string"));
        }
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    // A named copy: clang before 16 cannot capture a structured binding (the fuzz preset's).
    const absl::string_view tensor_name = name;
    auto bad = [&](absl::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", tensor_name, "': ", what));
    };
    if (!entry.is_object()) return bad("entry is not an object");
    const auto dtype_it = entry.find("dtype");
    const auto shape_it = entry.find("shape");
    const auto offsets_it = entry.find("data_offsets");
    if (dtype_it == entry.end() || !dtype_it->is_string()) return bad("missing string 'dtype'");
    if (shape_it == entry.end() || !shape_it->is_array()) return bad("missing array 'shape'");
    if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2) {
      return bad("'data_offsets' must be [begin, end]");
    }
    SafetensorsTensor t;
    t.name = name;
    absl::StatusOr<DType> type = DTypeFromSafetensors(dtype_it->get<std::string>());
    if (!type.ok()) {
      return absl::Status(type.status().code(),
                          absl::StrCat(path, ": tensor '", name, "': ", type.status().message()));
    }
    t.type = *type;
    if (shape_it->size() > 8) return bad("more than 8 dimensions");
    int64_t elements = 1;
    for (const json& d : *shape_it) {
      const std::optional<int64_t> v = NonNegativeInt(d);
      if (!v) return bad("shape entries must be non-negative integers");
      if (__builtin_mul_overflow(elements, *v, &elements)) return bad("element count overflows");
      t.shape.push_back(*v);
    }
    const std::optional<int64_t> bytes = DTypeStorageBytes(t.type, elements);
    if (!bytes) return bad("byte size overflows");
    const std::optional<int64_t> begin = NonNegativeInt((*offsets_it)[0]);
    const std::optional<int64_t> end = NonNegativeInt((*offsets_it)[1]);
    if (!begin || !end || *begin > *end) return bad("'data_offsets' must be 0 <= begin <= end");
    if (*end > data_size) {
      return absl::DataLossError(absl::StrCat(path, ": tensor '", name, "': data [", *begin, ", ",
                                              *end, ") runs past the ", data_size,
                                              "-byte data section"));
    }
    if (*end - *begin != *bytes) {
      return bad(absl::StrCat("data_offsets span ", *end - *begin, " bytes, but ",
                              DTypeName(t.type), " of ", elements, " elements needs ", *bytes));
    }
    t.bytes = *bytes;
    t.file_offset = data_offset_ + *begin;
    t.data = bytes_.data() + t.file_offset;
    spans.push_back({*begin, *end, tensors_.size()});
    tensors_.push_back(std::move(t));
  }
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].begin < spans[i - 1].end) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor '", tensors_[spans[i].tensor].name, "' overlaps tensor '",
          tensors_[spans[i - 1].tensor].name, "'"));
    }
  }
  std::sort(tensors_.begin(), tensors_.end(),
            [](const SafetensorsTensor& a, const SafetensorsTensor& b) { return a.name < b.name; });
  for (size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
  return absl::OkStatus();
}

}  // namespace tandem
