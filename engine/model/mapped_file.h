// A read-only view of a whole file: memory-mapped (MAP_PRIVATE, PROT_READ) or, for bytes already
// in memory, an owned 8-byte-aligned copy. Shared by the model file readers.
//
// Move-only; the bytes stay valid, at the same address, for the object's lifetime (moves keep the
// address). Thread-safe for reading.
#ifndef TANDEM_ENGINE_MODEL_MAPPED_FILE_H_
#define TANDEM_ENGINE_MODEL_MAPPED_FILE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

class MappedFile {
 public:
  // NOT_FOUND / PERMISSION_DENIED / UNAVAILABLE for the file system, INVALID_ARGUMENT for a path
  // that is not a regular file; messages name the path. An empty file maps to zero bytes.
  static absl::StatusOr<MappedFile> Open(const std::string& path);
  // Copies `bytes`; `name` is what path() reports.
  static MappedFile Copy(absl::string_view bytes, const std::string& name);

  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::string& path() const { return path_; }
  const uint8_t* data() const { return data_; }
  int64_t size() const { return size_; }

  // Lets the pages wholly inside [p, p + bytes) leave this process's resident memory: a mapped
  // file's bytes are read again from the file when next touched (their contents do not change).
  // For a caller that has copied the bytes elsewhere (e.g. repacked weights). A no-op for a Copy()
  // and for a range outside the file.
  void DropPages(const void* p, int64_t bytes) const;

 private:
  MappedFile() = default;
  void Release();

  std::string path_;
  const uint8_t* data_ = nullptr;
  int64_t size_ = 0;
  void* mapping_ = nullptr;             // munmap'ed on destruction when set
  std::unique_ptr<uint64_t[]> buffer_;  // owns the bytes of Copy()
};

}  // namespace tandem

#endif  // TANDEM_ENGINE_MODEL_MAPPED_FILE_H_
