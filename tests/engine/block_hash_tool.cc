// block_hash_tool: prints the block hashes of a token sequence, one per line in hex, so that tests
// can check them against an independent implementation of docs/block_hashing.md.
//
//   block_hash_tool MODEL_ID BLOCK_SIZE TOKEN...
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "engine/kv/block_hash.h"

int main(int argc, char** argv) {
  int64_t block_size = 0;
  if (argc < 3 || !absl::SimpleAtoi(argv[2], &block_size) || block_size <= 0) {
    std::fprintf(stderr, "usage: block_hash_tool MODEL_ID BLOCK_SIZE TOKEN...\n");
    return 2;
  }
  std::vector<int32_t> tokens;
  for (int i = 3; i < argc; ++i) {
    int32_t t = 0;
    if (!absl::SimpleAtoi(argv[i], &t) || t < 0) {
      std::fprintf(stderr, "bad token id: %s\n", argv[i]);
      return 2;
    }
    tokens.push_back(t);
  }
  std::printf("model %016llx\n",
              static_cast<unsigned long long>(tandem::ModelIdHash(argv[1])));
  for (tandem::BlockHash h :
       tandem::HashFullBlocks(tandem::ModelIdHash(argv[1]), tokens, block_size)) {
    std::printf("%016llx\n", static_cast<unsigned long long>(h));
  }
  return 0;
}
