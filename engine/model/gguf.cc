#include "engine/model/gguf.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr int kMaxArrayDepth = 8;        // arrays of arrays nest at most this deep
constexpr int kMaxDims = 4;
constexpr int64_t kDefaultAlignment = 32;

// Size on disk of one fixed-size scalar; 0 for string / array / unknown.
int64_t ScalarBytes(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
      return 8;
    case GgufValueType::kString:
    case GgufValueType::kArray:
      return 0;
  }
  return 0;
}

bool IsKnownValueType(uint32_t id) { return id <= static_cast<uint32_t>(GgufValueType::kFloat64); }

// Smallest number of bytes one element of `type` can occupy on disk (for bounding counts).
int64_t MinEncodedBytes(GgufValueType type) {
  if (type == GgufValueType::kString) return 8;   // length
  if (type == GgufValueType::kArray) return 12;   // element type + count
  return ScalarBytes(type);
}

template <typename T>
T LoadLE(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;  // the build targets little-endian hosts only (x86-64, aarch64)
}
static_assert(std::endian::native == std::endian::little, "GGUF reading assumes a little-endian host");

}  // namespace

absl::string_view GgufValueTypeName(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8: return "uint8";
    case GgufValueType::kInt8: return "int8";
    case GgufValueType::kUint16: return "uint16";
    case GgufValueType::kInt16: return "int16";
    case GgufValueType::kUint32: return "uint32";
    case GgufValueType::kInt32: return "int32";
    case GgufValueType::kFloat32: return "float32";
    case GgufValueType::kBool: return "bool";
    case GgufValueType::kString: return "string";
    case GgufValueType::kArray: return "array";
    case GgufValueType::kUint64: return "uint64";
    case GgufValueType::kInt64: return "int64";
    case GgufValueType::kFloat64: return "float64";
  }
  return "unknown";
}

bool IsGgufIntegerType(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
      return true;
    default:
      return false;
  }
}

namespace {
bool IsSignedIntegerType(GgufValueType type) {
  return type == GgufValueType::kInt8 || type == GgufValueType::kInt16 ||
         type == GgufValueType::kInt32 || type == GgufValueType::kInt64;
}
}  // namespace

// ---- GgufValue ----------------------------------------------------------------------------------

std::optional<int64_t> GgufValue::AsInt64() const {
  if (!IsGgufIntegerType(type_)) return std::nullopt;
  if (IsSignedIntegerType(type_)) return i64_;
  if (u64_ > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
  return static_cast<int64_t>(u64_);
}

std::optional<uint64_t> GgufValue::AsUint64() const {
  if (!IsGgufIntegerType(type_)) return std::nullopt;
  if (IsSignedIntegerType(type_)) {
    if (i64_ < 0) return std::nullopt;
    return static_cast<uint64_t>(i64_);
  }
  return u64_;
}

std::optional<double> GgufValue::AsFloat64() const {
  if (type_ != GgufValueType::kFloat32 && type_ != GgufValueType::kFloat64) return std::nullopt;
  return f64_;
}

std::optional<bool> GgufValue::AsBool() const {
  if (type_ != GgufValueType::kBool) return std::nullopt;
  return u64_ != 0;
}

std::optional<absl::string_view> GgufValue::AsString() const {
  if (type_ != GgufValueType::kString) return std::nullopt;
  return str_;
}

GgufValue GgufValue::element(int64_t i) const {
  if (element_type_ == GgufValueType::kArray) return (*arrays_)[static_cast<size_t>(i)];
  GgufValue v;
  v.type_ = element_type_;
  if (element_type_ == GgufValueType::kString) {
    v.str_ = (*strings_)[static_cast<size_t>(i)];
    return v;
  }
  const uint8_t* p = raw_ + i * ScalarBytes(element_type_);
  switch (element_type_) {
    case GgufValueType::kUint8: v.u64_ = LoadLE<uint8_t>(p); break;
    case GgufValueType::kBool: v.u64_ = LoadLE<uint8_t>(p); break;
    case GgufValueType::kInt8: v.i64_ = LoadLE<int8_t>(p); break;
    case GgufValueType::kUint16: v.u64_ = LoadLE<uint16_t>(p); break;
    case GgufValueType::kInt16: v.i64_ = LoadLE<int16_t>(p); break;
    case GgufValueType::kUint32: v.u64_ = LoadLE<uint32_t>(p); break;
    case GgufValueType::kInt32: v.i64_ = LoadLE<int32_t>(p); break;
    case GgufValueType::kUint64: v.u64_ = LoadLE<uint64_t>(p); break;
    case GgufValueType::kInt64: v.i64_ = LoadLE<int64_t>(p); break;
    case GgufValueType::kFloat32: v.f64_ = LoadLE<float>(p); break;
    case GgufValueType::kFloat64: v.f64_ = LoadLE<double>(p); break;
    case GgufValueType::kString:
    case GgufValueType::kArray:
      break;
  }
  return v;
}

int64_t GgufTensor::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // overflow excluded by the parser
  return n;
}

// ---- Parser -------------------------------------------------------------------------------------

class GgufParser {
 public:
  explicit GgufParser(GgufFile* file) : f_(file) {}

  absl::Status Parse();

 private:
  // Errors name the file, the field and the offset where the problem starts.
  absl::Status Invalid(absl::string_view field, int64_t at, absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(f_->path_, ": ", field, " at offset ", at, ": ", what));
  }
  absl::Status Truncated(absl::string_view field, int64_t at, int64_t need) const {
    return absl::DataLossError(absl::StrCat(f_->path_, ": ", field, " at offset ", at,
                                            ": file truncated (needs ", need, " bytes, ",
                                            f_->size_ - at, " left of ", f_->size_, ")"));
  }
  int64_t Remaining() const { return f_->size_ - pos_; }

  absl::Status Need(absl::string_view field, int64_t n) const {
    if (n < 0 || n > Remaining()) return Truncated(field, pos_, n);
    return absl::OkStatus();
  }
  template <typename T>
  absl::StatusOr<T> Read(absl::string_view field) {
    RETURN_IF_ERROR(Need(field, sizeof(T)));
    T v = LoadLE<T>(f_->base_ + pos_);
    pos_ += sizeof(T);
    return v;
  }
  absl::StatusOr<absl::string_view> ReadString(absl::string_view field);
  absl::StatusOr<GgufValue> ReadValue(absl::string_view key, GgufValueType type, int depth);
  absl::StatusOr<GgufValue> ReadArray(absl::string_view key, int depth);
  absl::Status ReadTensorInfo(int64_t index, std::vector<uint64_t>* offsets);

  GgufFile* f_;
  int64_t pos_ = 0;
};

absl::StatusOr<absl::string_view> GgufParser::ReadString(absl::string_view field) {
  const int64_t at = pos_;
  ASSIGN_OR_RETURN(uint64_t len, Read<uint64_t>(field));
  if (len > static_cast<uint64_t>(Remaining())) {
    return absl::DataLossError(absl::StrCat(f_->path_, ": ", field, " at offset ", at,
                                            ": string length ", len, " exceeds the ", Remaining(),
                                            " bytes left in the file"));
  }
  absl::string_view s(reinterpret_cast<const char*>(f_->base_ + pos_), static_cast<size_t>(len));
  pos_ += static_cast<int64_t>(len);
  return s;
}

absl::StatusOr<GgufValue> GgufParser::ReadArray(absl::string_view key, int depth) {
  const std::string field = absl::StrCat("metadata key '", key, "' (array)");
  if (depth >= kMaxArrayDepth) {
    return Invalid(field, pos_, absl::StrCat("arrays nested deeper than ", kMaxArrayDepth));
  }
  const int64_t type_at = pos_;
  ASSIGN_OR_RETURN(uint32_t type_id, Read<uint32_t>(field));
  if (!IsKnownValueType(type_id)) {
    return Invalid(field, type_at, absl::StrCat("unknown array element type ", type_id));
  }
  const auto elem = static_cast<GgufValueType>(type_id);
  const int64_t count_at = pos_;
  ASSIGN_OR_RETURN(uint64_t count, Read<uint64_t>(field));
  const int64_t min_bytes = MinEncodedBytes(elem);
  if (count > static_cast<uint64_t>(Remaining() / min_bytes)) {
    return absl::DataLossError(absl::StrCat(
        f_->path_, ": ", field, " at offset ", count_at, ": array of ", count, " ",
        GgufValueTypeName(elem), " elements cannot fit in the ", Remaining(),
        " bytes left in the file"));
  }
  GgufValue v;
  v.type_ = GgufValueType::kArray;
  v.element_type_ = elem;
  v.count_ = static_cast<int64_t>(count);
  if (elem == GgufValueType::kString) {
    auto strings = std::make_shared<std::vector<absl::string_view>>();
    strings->reserve(count);
    for (uint64_t i = 0; i < count; ++i) {
      ASSIGN_OR_RETURN(absl::string_view s,
                       ReadString(absl::StrCat("metadata key '", key, "' element ", i)));
      strings->push_back(s);
    }
    v.strings_ = std::move(strings);
  } else if (elem == GgufValueType::kArray) {
    auto arrays = std::make_shared<std::vector<GgufValue>>();
    arrays->reserve(count);
    for (uint64_t i = 0; i < count; ++i) {
      ASSIGN_OR_RETURN(GgufValue sub, ReadArray(key, depth + 1));
      arrays->push_back(std::move(sub));
    }
    v.arrays_ = std::move(arrays);
  } else {
    v.raw_ = f_->base_ + pos_;
    if (elem == GgufValueType::kBool) {
      for (uint64_t i = 0; i < count; ++i) {
        if (v.raw_[i] > 1) {
          return Invalid(absl::StrCat("metadata key '", key, "' element ", i),
                         pos_ + static_cast<int64_t>(i),
                         absl::StrCat("bool value ", v.raw_[i], " is neither 0 nor 1"));
        }
      }
    }
    pos_ += static_cast<int64_t>(count) * min_bytes;  // bounded above
  }
  return v;
}

absl::StatusOr<GgufValue> GgufParser::ReadValue(absl::string_view key, GgufValueType type,
                                                int depth) {
  const std::string field = absl::StrCat("metadata key '", key, "'");
  GgufValue v;
  v.type_ = type;
  const int64_t at = pos_;
  switch (type) {
    case GgufValueType::kUint8: { ASSIGN_OR_RETURN(v.u64_, Read<uint8_t>(field)); break; }
    case GgufValueType::kInt8: { ASSIGN_OR_RETURN(v.i64_, Read<int8_t>(field)); break; }
    case GgufValueType::kUint16: { ASSIGN_OR_RETURN(v.u64_, Read<uint16_t>(field)); break; }
    case GgufValueType::kInt16: { ASSIGN_OR_RETURN(v.i64_, Read<int16_t>(field)); break; }
    case GgufValueType::kUint32: { ASSIGN_OR_RETURN(v.u64_, Read<uint32_t>(field)); break; }
    case GgufValueType::kInt32: { ASSIGN_OR_RETURN(v.i64_, Read<int32_t>(field)); break; }
    case GgufValueType::kUint64: { ASSIGN_OR_RETURN(v.u64_, Read<uint64_t>(field)); break; }
    case GgufValueType::kInt64: { ASSIGN_OR_RETURN(v.i64_, Read<int64_t>(field)); break; }
    case GgufValueType::kFloat32: { ASSIGN_OR_RETURN(v.f64_, Read<float>(field)); break; }
    case GgufValueType::kFloat64: { ASSIGN_OR_RETURN(v.f64_, Read<double>(field)); break; }
    case GgufValueType::kBool: {
      ASSIGN_OR_RETURN(uint8_t b, Read<uint8_t>(field));
      if (b > 1) return Invalid(field, at, absl::StrCat("bool value ", b, " is neither 0 nor 1"));
      v.u64_ = b;
      break;
    }
    case GgufValueType::kString: { ASSIGN_OR_RETURN(v.str_, ReadString(field)); break; }
    case GgufValueType::kArray: return ReadArray(key, depth);
  }
  return v;
}

absl::Status GgufParser::ReadTensorInfo(int64_t index, std::vector<uint64_t>* offsets) {
  const int64_t start = pos_;
  ASSIGN_OR_RETURN(absl::string_view name,
                   ReadString(absl::StrCat("tensor #", index, " name")));
  const std::string field = absl::StrCat("tensor '", name, "'");
  if (name.empty()) return Invalid(absl::StrCat("tensor #", index), start, "empty name");
  const int64_t dims_at = pos_;
  ASSIGN_OR_RETURN(uint32_t n_dims, Read<uint32_t>(field));
  if (n_dims < 1 || n_dims > kMaxDims) {
    return Invalid(field, dims_at, absl::StrCat("has ", n_dims, " dimensions; expected 1 to ",
                                                kMaxDims));
  }
  GgufTensor t;
  t.name = std::string(name);
  int64_t elements = 1;
  for (uint32_t d = 0; d < n_dims; ++d) {
    const int64_t at = pos_;
    ASSIGN_OR_RETURN(uint64_t ne, Read<uint64_t>(field));
    if (ne < 1 || ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Invalid(field, at, absl::StrCat("dimension ", d, " is ", ne, "; must be >= 1"));
    }
    if (__builtin_mul_overflow(elements, static_cast<int64_t>(ne), &elements)) {
      return Invalid(field, at, "element count overflows int64");
    }
    t.shape.push_back(static_cast<int64_t>(ne));
  }
  const int64_t type_at = pos_;
  ASSIGN_OR_RETURN(uint32_t type_id, Read<uint32_t>(field));
  absl::StatusOr<DType> type = DTypeFromGgmlTypeId(type_id);
  if (!type.ok()) {
    const absl::StatusCode code = type.status().code() == absl::StatusCode::kUnimplemented
                                      ? absl::StatusCode::kUnimplemented
                                      : absl::StatusCode::kInvalidArgument;
    return absl::Status(code, absl::StrCat(f_->path_, ": ", field, " at offset ", type_at, ": ",
                                           type.status().message()));
  }
  t.type = *type;
  const int64_t block = DTypeBlockElements(t.type);
  if (t.shape[0] % block != 0) {
    return Invalid(field, dims_at, absl::StrCat("ne[0] = ", t.shape[0], " is not a multiple of the ",
                                                DTypeName(t.type), " block size ", block));
  }
  const std::optional<int64_t> bytes = DTypeStorageBytes(t.type, elements);
  if (!bytes) return Invalid(field, dims_at, "byte size overflows int64");
  t.bytes = *bytes;
  t.file_offset = pos_;  // offset of the offset field, until the data section is known
  ASSIGN_OR_RETURN(uint64_t offset, Read<uint64_t>(field));
  if (f_->tensor_index_.contains(t.name)) {
    return Invalid(field, start, "duplicate tensor name");
  }
  f_->tensor_index_.emplace(t.name, f_->tensors_.size());
  f_->tensors_.push_back(std::move(t));
  offsets->push_back(offset);
  return absl::OkStatus();
}

absl::Status GgufParser::Parse() {
  ASSIGN_OR_RETURN(uint32_t magic, Read<uint32_t>("magic"));
  if (magic != kMagic) {
    return Invalid("magic", 0, absl::StrCat("not a GGUF file (magic 0x", absl::Hex(magic),
                                            ", expected 0x", absl::Hex(kMagic), " \"GGUF\")"));
  }
  ASSIGN_OR_RETURN(uint32_t version, Read<uint32_t>("version"));
  if (version == 1) {
    return absl::UnimplementedError(absl::StrCat(
        f_->path_, ": version at offset 4: GGUF version 1 is not supported (only 2 and 3); "
                   "convert the file with a current llama.cpp"));
  }
  if (version == 0x02000000u || version == 0x03000000u) {
    return absl::UnimplementedError(
        absl::StrCat(f_->path_, ": version at offset 4: big-endian GGUF files are not supported"));
  }
  if (version != 2 && version != 3) {
    return Invalid("version", 4, absl::StrCat("unsupported GGUF version ", version,
                                              " (supported: 2, 3)"));
  }
  f_->version_ = version;
  ASSIGN_OR_RETURN(uint64_t tensor_count, Read<uint64_t>("tensor_count"));
  ASSIGN_OR_RETURN(uint64_t kv_count, Read<uint64_t>("metadata_kv_count"));
  // Minimal encodings: a key/value is 8 (key length) + 4 (type) + 1 (u8) bytes; a tensor info is
  // 8 (name length) + 4 (n_dims) + 8 (one dim) + 4 (type) + 8 (offset) bytes.
  constexpr int64_t kMinKv = 13;
  constexpr int64_t kMinTensorInfo = 32;
  if (kv_count > static_cast<uint64_t>(Remaining() / kMinKv)) {
    return absl::DataLossError(absl::StrCat(f_->path_, ": metadata_kv_count at offset 16: ",
                                            kv_count, " key/values cannot fit in the ",
                                            Remaining(), " bytes left in the file"));
  }
  if (tensor_count > static_cast<uint64_t>(Remaining() / kMinTensorInfo)) {
    return absl::DataLossError(absl::StrCat(f_->path_, ": tensor_count at offset 8: ",
                                            tensor_count, " tensor infos cannot fit in the ",
                                            Remaining(), " bytes left in the file"));
  }

  f_->metadata_.reserve(kv_count);
  for (uint64_t i = 0; i < kv_count; ++i) {
    const int64_t key_at = pos_;
    ASSIGN_OR_RETURN(absl::string_view key, ReadString(absl::StrCat("metadata key #", i)));
    if (key.empty()) return Invalid(absl::StrCat("metadata key #", i), key_at, "empty key");
    if (f_->metadata_index_.contains(key)) {
      return Invalid(absl::StrCat("metadata key '", key, "'"), key_at, "duplicate key");
    }
    const int64_t type_at = pos_;
    ASSIGN_OR_RETURN(uint32_t type_id,
                     Read<uint32_t>(absl::StrCat("metadata key '", key, "' type")));
    if (!IsKnownValueType(type_id)) {
      return Invalid(absl::StrCat("metadata key '", key, "'"), type_at,
                     absl::StrCat("unknown value type ", type_id));
    }
    ASSIGN_OR_RETURN(GgufValue value, ReadValue(key, static_cast<GgufValueType>(type_id), 0));
    f_->metadata_index_.emplace(key, f_->metadata_.size());
    f_->metadata_.push_back(GgufKeyValue{key, std::move(value)});
  }

  if (const GgufValue* a = f_->Find("general.alignment")) {
    const std::optional<uint64_t> align = a->AsUint64();
    if (!align || *align == 0 || (*align & (*align - 1)) != 0 || *align > (1u << 30)) {
      return absl::InvalidArgumentError(absl::StrCat(
          f_->path_, ": metadata key 'general.alignment': must be a non-zero power-of-two "
                     "integer up to 2^30, got ",
          align ? absl::StrCat(*align) : absl::StrCat("a ", GgufValueTypeName(a->type()))));
    }
    f_->alignment_ = static_cast<int64_t>(*align);
  } else {
    f_->alignment_ = kDefaultAlignment;
  }

  std::vector<uint64_t> offsets;
  f_->tensors_.reserve(tensor_count);
  for (uint64_t i = 0; i < tensor_count; ++i) {
    RETURN_IF_ERROR(ReadTensorInfo(static_cast<int64_t>(i), &offsets));
  }
  const int64_t align = f_->alignment_;
  f_->data_offset_ = (pos_ + align - 1) / align * align;  // pos_ <= size_, no overflow

  // Place every tensor and check it lies inside the file without overlapping another.
  for (size_t i = 0; i < f_->tensors_.size(); ++i) {
    GgufTensor& t = f_->tensors_[i];
    const int64_t field_at = t.file_offset;
    const std::string field = absl::StrCat("tensor '", t.name, "' data offset");
    if (offsets[i] % static_cast<uint64_t>(align) != 0) {
      return Invalid(field, field_at, absl::StrCat("offset ", offsets[i],
                                                   " is not a multiple of the alignment ", align));
    }
    const uint64_t room = static_cast<uint64_t>(
        std::max<int64_t>(0, f_->size_ - f_->data_offset_));
    if (offsets[i] > room || static_cast<uint64_t>(t.bytes) > room - offsets[i]) {
      return absl::DataLossError(absl::StrCat(
          f_->path_, ": ", field, " at offset ", field_at, ": data [", offsets[i], ", +", t.bytes,
          ") relative to the data section at ", f_->data_offset_, " runs past the end of the ",
          f_->size_, "-byte file"));
    }
    t.file_offset = f_->data_offset_ + static_cast<int64_t>(offsets[i]);
    t.data = f_->base_ + t.file_offset;
  }
  std::vector<const GgufTensor*> by_offset;
  by_offset.reserve(f_->tensors_.size());
  for (const GgufTensor& t : f_->tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensor* a, const GgufTensor* b) { return a->file_offset < b->file_offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const GgufTensor* prev = by_offset[i - 1];
    const GgufTensor* cur = by_offset[i];
    if (prev->file_offset + prev->bytes > cur->file_offset) {
      return Invalid(absl::StrCat("tensor '", cur->name, "' data"), cur->file_offset,
                     absl::StrCat("overlaps tensor '", prev->name, "' at [", prev->file_offset,
                                  ", ", prev->file_offset + prev->bytes, ")"));
    }
  }
  return absl::OkStatus();
}

// ---- GgufFile -----------------------------------------------------------------------------------

GgufFile::GgufFile(MappedFile bytes)
    : bytes_(std::move(bytes)),
      path_(bytes_.path()),
      base_(bytes_.data()),
      size_(bytes_.size()) {}

GgufFile::~GgufFile() = default;

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Parse(MappedFile bytes) {
  std::unique_ptr<GgufFile> file(new GgufFile(std::move(bytes)));
  GgufParser parser(file.get());
  RETURN_IF_ERROR(parser.Parse());
  return file;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  ASSIGN_OR_RETURN(MappedFile bytes, MappedFile::Open(path));
  return Parse(std::move(bytes));
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::FromBytes(absl::string_view bytes,
                                                              const std::string& name) {
  return Parse(MappedFile::Copy(bytes, name));
}

bool GgufFile::Has(absl::string_view key) const { return metadata_index_.contains(key); }

const GgufValue* GgufFile::Find(absl::string_view key) const {
  auto it = metadata_index_.find(key);
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].value;
}

const GgufTensor* GgufFile::FindTensor(absl::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

void GgufFile::DropPages(const GgufTensor& tensor, int64_t bytes) const {
  bytes_.DropPages(tensor.data, bytes < 0 ? tensor.bytes : std::min(bytes, tensor.bytes));
}

namespace {

std::string TypeDesc(const GgufValue& v) {
  if (v.type() == GgufValueType::kArray) {
    return absl::StrCat("array of ", GgufValueTypeName(v.element_type()));
  }
  return std::string(GgufValueTypeName(v.type()));
}

absl::Status WrongType(const std::string& path, absl::string_view key, absl::string_view expected,
                       const GgufValue& v) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": metadata key '", key, "': expected ",
                                                 expected, ", got ", TypeDesc(v)));
}

}  // namespace

#define TANDEM_GGUF_FIND_OR_RETURN(v, key)                                                    \
  const GgufValue* v = Find(key);                                                             \
  if (v == nullptr) {                                                                         \
    return absl::NotFoundError(absl::StrCat(path_, ": metadata key '", key, "' not found")); \
  }

absl::StatusOr<absl::string_view> GgufFile::GetString(absl::string_view key) const {
  TANDEM_GGUF_FIND_OR_RETURN(v, key);
  if (auto s = v->AsString()) return *s;
  return WrongType(path_, key, "string", *v);
}

absl::StatusOr<uint64_t> GgufFile::GetUint64(absl::string_view key) const {
  TANDEM_GGUF_FIND_OR_RETURN(v, key);
  if (!IsGgufIntegerType(v->type())) return WrongType(path_, key, "an integer", *v);
  if (auto u = v->AsUint64()) return *u;
  return absl::InvalidArgumentError(absl::StrCat(path_, ": metadata key '", key, "': value ",
                                                 *v->AsInt64(), " is negative"));
}

absl::StatusOr<uint32_t> GgufFile::GetUint32(absl::string_view key) const {
  ASSIGN_OR_RETURN(uint64_t u, GetUint64(key));
  if (u > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": metadata key '", key, "': value ", u, " does not fit in uint32"));
  }
  return static_cast<uint32_t>(u);
}

absl::StatusOr<int64_t> GgufFile::GetInt64(absl::string_view key) const {
  TANDEM_GGUF_FIND_OR_RETURN(v, key);
  if (!IsGgufIntegerType(v->type())) return WrongType(path_, key, "an integer", *v);
  if (auto i = v->AsInt64()) return *i;
  return absl::InvalidArgumentError(absl::StrCat(path_, ": metadata key '", key, "': value ",
                                                 *v->AsUint64(), " does not fit in int64"));
}

absl::StatusOr<float> GgufFile::GetFloat32(absl::string_view key) const {
  TANDEM_GGUF_FIND_OR_RETURN(v, key);
  if (auto f = v->AsFloat64()) return static_cast<float>(*f);
  return WrongType(path_, key, "float32 or float64", *v);
}

absl::StatusOr<bool> GgufFile::GetBool(absl::string_view key) const {
  TANDEM_GGUF_FIND_OR_RETURN(v, key);
  if (auto b = v->AsBool()) return *b;
  return WrongType(path_, key, "bool", *v);
}

absl::StatusOr<std::vector<absl::string_view>> GgufFile::GetStringArray(
    absl::string_view key) const {
  TANDEM_GGUF_FIND_OR_RETURN(v, key);
  if (v->type() != GgufValueType::kArray || v->element_type() != GgufValueType::kString) {
    return WrongType(path_, key, "array of string", *v);
  }
  std::vector<absl::string_view> out;
  out.reserve(static_cast<size_t>(v->size()));
  for (int64_t i = 0; i < v->size(); ++i) out.push_back(*v->element(i).AsString());
  return out;
}

absl::StatusOr<std::vector<float>> GgufFile::GetFloat32Array(absl::string_view key) const {
  TANDEM_GGUF_FIND_OR_RETURN(v, key);
  if (v->type() != GgufValueType::kArray || (v->element_type() != GgufValueType::kFloat32 &&
                                             v->element_type() != GgufValueType::kFloat64)) {
    return WrongType(path_, key, "array of float32 or float64", *v);
  }
  std::vector<float> out;
  out.reserve(static_cast<size_t>(v->size()));
  for (int64_t i = 0; i < v->size(); ++i) {
    out.push_back(static_cast<float>(*v->element(i).AsFloat64()));
  }
  return out;
}

absl::StatusOr<std::vector<int32_t>> GgufFile::GetInt32Array(absl::string_view key) const {
  TANDEM_GGUF_FIND_OR_RETURN(v, key);
  if (v->type() != GgufValueType::kArray || !IsGgufIntegerType(v->element_type())) {
    return WrongType(path_, key, "array of integers", *v);
  }
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(v->size()));
  for (int64_t i = 0; i < v->size(); ++i) {
    const std::optional<int64_t> x = v->element(i).AsInt64();
    if (!x || *x < std::numeric_limits<int32_t>::min() ||
        *x > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(absl::StrCat(path_, ": metadata key '", key, "' element ",
                                                     i, " does not fit in int32"));
    }
    out.push_back(static_cast<int32_t>(*x));
  }
  return out;
}

#undef TANDEM_GGUF_FIND_OR_RETURN

}  // namespace tandem
