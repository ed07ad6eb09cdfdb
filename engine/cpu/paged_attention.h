// Causal attention for a batch of sequences whose K/V live in a paged cache.
//
// One call serves a whole step: the batch's query tokens may be prefill-chunk tokens and single
// decode tokens mixed in any order. Token t belongs to sequence token_seq[t] and sits at position
// token_pos[t]; it attends to that sequence's cache positions 0..token_pos[t] (so the K/V of the
// step's own tokens must already be written to the cache), or with a sliding window of W
// positions (Mistral's) only to max(0, token_pos[t] - W + 1)..token_pos[t]. Cache position p of sequence s is slot
// p % block_size of physical block block_tables[s * max_blocks_per_seq + p / block_size].
//
// One pass per (token, head): online softmax (running max and sum, as in FlashAttention) over the
// cache in fixed chunks of 32 positions, whatever the block size, so paging does not change the
// result; the q·k and p·v inner loops run on the active ISA. Threaded over (token, head) pairs.
// With AVX2 or AVX-512 and head_dim 64 (up to 6 query heads per KV head), one pass per (token,
// KV head) serves all its query heads at once, 8 or 16 positions per step (kernel_table.h's
// Attend64Fn); likewise up to 8 tokens of one sequence at consecutive positions (a prompt
// chunk's) share one pass as well, each key chunk widened and transposed once for all of them
// (Attend64RowsFn), with every output bit for bit what its token alone gives. The cache may hold
// F32 or F16 elements (kv_type); F16 is widened as it is read.
#ifndef TANDEM_ENGINE_CPU_PAGED_ATTENTION_H_
#define TANDEM_ENGINE_CPU_PAGED_ATTENTION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "engine/core/dtype.h"
#include "engine/cpu/kernel_context.h"

namespace tandem::cpu {

struct PagedAttentionParams {
  // [num_tokens, num_heads, head_dim]: head h of token t at q + t * q_token_stride + h * head_dim.
  const float* q = nullptr;
  int64_t q_token_stride = 0;  // floats between tokens (>= num_heads * head_dim)
  // [num_tokens, num_heads, head_dim], at out + t * out_token_stride + h * head_dim.
  float* out = nullptr;
  int64_t out_token_stride = 0;

  // K and V caches with the same layout: element d of kv-head g at slot j of physical block b is
  //   cache[b * block_stride + j * token_stride + g * kv_head_stride + d]   (head_dim contiguous)
  // in elements of kv_type: F32 (float) or F16 (IEEE half bits, widened to float as they are read).
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  DType kv_type = DType::kF32;
  int64_t block_stride = 0;    // elements
  int64_t token_stride = 0;    // elements
  int64_t kv_head_stride = 0;  // elements
  int64_t block_size = 0;      // tokens per block

  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq] physical block ids
  int64_t max_blocks_per_seq = 0;
  const int32_t* token_seq = nullptr;  // [num_tokens] sequence index (row of block_tables)
  const int32_t* token_pos = nullptr;  // [num_tokens] position; attends to 0..token_pos[t]

  int64_t num_tokens = 0;
  int64_t num_heads = 0;  // query heads; a multiple of num_kv_heads (GQA group = ratio)
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  float scale = 0.0f;  // applied to q·k; 0 means 1 / sqrt(head_dim)
  // > 0: each scaled score s becomes softcap * tanh(s / softcap) before the softmax (Gemma 2's
  // attention logit soft-capping); such calls take the portable loop, not the head_dim-64 tiles.
  float softcap = 0.0f;
  // > 0: sliding-window attention, each token sees its last `window` positions (itself
  // included); 0: every position up to its own.
  int64_t window = 0;
};

// INVALID_ARGUMENT for inconsistent sizes (non-positive head_dim / block_size, num_heads not a
// multiple of num_kv_heads, null pointers with tokens present, a negative window or softcap) or a kv_type other than F32 / F16.
// Positions and block ids are the caller's contract (checked one layer up) and are not validated
// per token.
[[nodiscard]] absl::Status PagedAttention(const PagedAttentionParams& params,
                                          const KernelContext& context = {});

// The ground truth for tests: per (token, head), all scores in double, full softmax, weighted V.
// Single-threaded and slow. Same contract as PagedAttention.
[[nodiscard]] absl::Status PagedAttentionReference(const PagedAttentionParams& params);

}  // namespace tandem::cpu

#endif  // TANDEM_ENGINE_CPU_PAGED_ATTENTION_H_
