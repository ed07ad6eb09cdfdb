// Fuzzes the safetensors reader (engine/model/safetensors.h): the input is a whole file (an 8-byte
// header length, the JSON header, the data). An accepted file's tensors and metadata are read
// back; every tensor's bytes must lie inside the input.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "engine/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto file = tandem::SafetensorsFile::FromBytes(bytes, "fuzz.safetensors");
  if (!file.ok()) return 0;
  for (const tandem::SafetensorsTensor& tensor : (*file)->tensors()) {
    (void)tensor.elements();
    if (tensor.file_offset < (*file)->data_offset() || tensor.bytes < 0 ||
        static_cast<uint64_t>(tensor.file_offset) + static_cast<uint64_t>(tensor.bytes) > size) {
      std::abort();  // a tensor outside the file
    }
    if ((*file)->FindTensor(tensor.name) == nullptr) std::abort();
  }
  for (const auto& [key, value] : (*file)->metadata()) (void)(key.size() + value.size());
  return 0;
}
