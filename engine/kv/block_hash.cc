#include "engine/kv/block_hash.h"

#include "common/logging.h"
#include "xxhash.h"

namespace tandem {
namespace {

void PutLe64(uint64_t v, unsigned char* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));
}

void PutLe32(uint32_t v, unsigned char* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));
}

}  // namespace

uint64_t ModelIdHash(absl::string_view model_id) {
  return XXH3_64bits_withSeed(model_id.data(), model_id.size(), kBlockHashSeed);
}

BlockHash HashBlock(std::optional<BlockHash> parent, uint64_t model_hash,
                    absl::Span<const int32_t> tokens) {
  // 16 header bytes and 4 per token; blocks are small, so the buffer lives on the stack up to 256
  // tokens.
  constexpr size_t kStackTokens = 256;
  unsigned char stack[16 + 4 * kStackTokens];
  std::vector<unsigned char> heap;
  unsigned char* buf = stack;
  const size_t bytes = 16 + 4 * tokens.size();
  if (tokens.size() > kStackTokens) {
    heap.resize(bytes);
    buf = heap.data();
  }
  PutLe64(parent.value_or(0), buf);
  PutLe64(model_hash, buf + 8);
  for (size_t i = 0; i < tokens.size(); ++i) {
    PutLe32(static_cast<uint32_t>(tokens[i]), buf + 16 + 4 * i);
  }
  return XXH3_64bits_withSeed(buf, bytes, kBlockHashSeed);
}

void ExtendBlockHashes(uint64_t model_hash, absl::Span<const int32_t> tokens, int64_t block_size,
                       std::vector<BlockHash>* hashes) {
  CHECK(block_size > 0);
  const size_t full = tokens.size() / static_cast<size_t>(block_size);
  for (size_t b = hashes->size(); b < full; ++b) {
    std::optional<BlockHash> parent;
    if (b > 0) parent = (*hashes)[b - 1];
    hashes->push_back(HashBlock(parent, model_hash,
                                tokens.subspan(b * static_cast<size_t>(block_size),
                                               static_cast<size_t>(block_size))));
  }
}

std::vector<BlockHash> HashFullBlocks(uint64_t model_hash, absl::Span<const int32_t> tokens,
                                      int64_t block_size) {
  std::vector<BlockHash> hashes;
  ExtendBlockHashes(model_hash, tokens, block_size, &hashes);
  return hashes;
}

}  // namespace tandem
