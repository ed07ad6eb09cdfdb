#include "engine/model/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem {

absl::StatusOr<MappedFile> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string msg = absl::StrCat(path, ": cannot open: ", std::strerror(err));
    if (err == ENOENT) return absl::NotFoundError(msg);
    if (err == EACCES) return absl::PermissionDeniedError(msg);
    return absl::UnavailableError(msg);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::UnavailableError(absl::StrCat(path, ": cannot stat: ", std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  MappedFile file;
  file.path_ = path;
  file.size_ = static_cast<int64_t>(st.st_size);
  if (file.size_ > 0) {
    void* m = ::mmap(nullptr, static_cast<size_t>(file.size_), PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return absl::UnavailableError(absl::StrCat(path, ": cannot mmap: ", std::strerror(err)));
    }
    file.mapping_ = m;
    file.data_ = static_cast<const uint8_t*>(m);
  }
  ::close(fd);  // the mapping stays valid
  return file;
}

MappedFile MappedFile::Copy(absl::string_view bytes, const std::string& name) {
  MappedFile file;
  file.path_ = name;
  file.size_ = static_cast<int64_t>(bytes.size());
  file.buffer_ = std::make_unique<uint64_t[]>((bytes.size() + 7) / 8 + 1);
  if (!bytes.empty()) std::memcpy(file.buffer_.get(), bytes.data(), bytes.size());
  file.data_ = reinterpret_cast<const uint8_t*>(file.buffer_.get());
  return file;
}

MappedFile::MappedFile(MappedFile&& other) noexcept { *this = std::move(other); }

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    Release();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapping_ = std::exchange(other.mapping_, nullptr);
    buffer_ = std::move(other.buffer_);
  }
  return *this;
}

MappedFile::~MappedFile() { Release(); }

void MappedFile::DropPages(const void* p, int64_t bytes) const {
  if (mapping_ == nullptr || bytes <= 0) return;
  const auto begin = reinterpret_cast<uintptr_t>(p);
  const auto base = reinterpret_cast<uintptr_t>(data_);
  if (begin < base || begin + static_cast<uint64_t>(bytes) > base + static_cast<uint64_t>(size_)) {
    return;
  }
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = (begin + page - 1) / page * page;
  const uintptr_t last = (begin + static_cast<uint64_t>(bytes)) / page * page;
  // Advice only: a failure leaves the pages resident, which is what not asking would have done.
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

void MappedFile::Release() {
  if (mapping_ != nullptr) ::munmap(mapping_, static_cast<size_t>(size_));
  mapping_ = nullptr;
  data_ = nullptr;
  size_ = 0;
  buffer_.reset();
}

}  // namespace tandem
