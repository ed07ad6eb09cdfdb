#include "engine/model/mapped_file.h"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * ::sysconf(_SC_PAGESIZE);
}

uint8_t Pattern(int64_t i) { return static_cast<uint8_t>((i * 131) ^ (i >> 9)); }

// DropPages lets a read-only mapping's pages leave the resident set, and the bytes read back the
// same afterwards (from the file); outside the mapping, and for an in-memory copy, it does nothing.
TEST(MappedFileTest, DroppedPagesLeaveTheResidentSetAndReadBackTheSame) {
  constexpr int64_t kBytes = 16 << 20;
  const std::string path = absl::StrCat(::testing::TempDir(), "/mapped_file_test_", getpid());
  {
    std::vector<char> bytes(kBytes);
    for (int64_t i = 0; i < kBytes; ++i) bytes[i] = static_cast<char>(Pattern(i));
    std::ofstream(path, std::ios::binary).write(bytes.data(), kBytes);
  }
  absl::StatusOr<MappedFile> file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->size(), kBytes);
  uint64_t sum = 0;
  for (int64_t i = 0; i < kBytes; i += 64) sum += file->data()[i];  // fault every page in
  EXPECT_GT(sum, 0u);
  const int64_t before = ResidentBytes();
  // An unaligned range: only the whole pages inside it go.
  file->DropPages(file->data() + 100, kBytes - 200);
  const int64_t after = ResidentBytes();
  EXPECT_GT(before - after, kBytes / 2) << "resident " << before << " -> " << after;
  for (int64_t i = 0; i < kBytes; ++i) ASSERT_EQ(file->data()[i], Pattern(i)) << "byte " << i;

  // Outside the mapping: ignored.
  std::vector<uint8_t> other(4096 * 4, 7);
  file->DropPages(other.data(), static_cast<int64_t>(other.size()));
  EXPECT_EQ(other[4096], 7);
  // A copy in memory keeps its bytes (advice would zero anonymous pages).
  const std::string bytes(1 << 16, 'x');
  MappedFile copy = MappedFile::Copy(bytes, "copy");
  copy.DropPages(copy.data(), copy.size());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(copy.data()), copy.size()), bytes);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace tandem
