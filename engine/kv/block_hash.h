// Block hashes: the names of full KV blocks that prefix caching, KV events and the router share.
// The definition is a contract, written out in docs/block_hashing.md so that other programs can
// compute the same values:
//
//   model  = XXH3_64bits_withSeed(UTF-8 bytes of the model id, kBlockHashSeed)
//   h[0]   = XXH3_64bits_withSeed(le64(0)      || le64(model) || le32(t) for each token, seed)
//   h[i]   = XXH3_64bits_withSeed(le64(h[i-1]) || le64(model) || le32(t) for each token, seed)
//
// over the `block_size` token ids of block i. Only full blocks have a hash.
//
//   const uint64_t model = ModelIdHash("SmolLM2-135M-Instruct");
//   std::vector<BlockHash> hashes = HashFullBlocks(model, tokens, /*block_size=*/16);
#ifndef TANDEM_ENGINE_KV_BLOCK_HASH_H_
#define TANDEM_ENGINE_KV_BLOCK_HASH_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tandem {

using BlockHash = uint64_t;

// "TANDEMH1" read as a little-endian 64-bit integer.
inline constexpr uint64_t kBlockHashSeed = 0x3148'4D45'444E'4154ULL;

// The hash of a model id, an input of every block hash.
uint64_t ModelIdHash(absl::string_view model_id);

// The hash of one full block whose tokens are `tokens`, chained on `parent` (nullopt for a
// sequence's first block).
BlockHash HashBlock(std::optional<BlockHash> parent, uint64_t model_hash,
                    absl::Span<const int32_t> tokens);

// Appends to `hashes` the hashes of the full blocks of `tokens` that it does not hold yet (it holds
// those of the first hashes->size() blocks).
void ExtendBlockHashes(uint64_t model_hash, absl::Span<const int32_t> tokens, int64_t block_size,
                       std::vector<BlockHash>* hashes);

// The hashes of every full block of `tokens`.
std::vector<BlockHash> HashFullBlocks(uint64_t model_hash, absl::Span<const int32_t> tokens,
                                      int64_t block_size);

}  // namespace tandem

#endif  // TANDEM_ENGINE_KV_BLOCK_HASH_H_
