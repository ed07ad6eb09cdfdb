// Causal attention over the paged KV cache on the GPU, as cpu::PagedAttention
// (engine/cpu/paged_attention.h): one call serves a whole step, whose query tokens may be
// prefill-chunk tokens and single decode tokens of several sequences, mixed. Token t belongs to
// sequence token_seq[t], sits at position token_pos[t] and attends to that sequence's cache
// positions 0..token_pos[t] (the step's own K/V are written to the cache first). Cache position p
// of sequence s is slot p % block_size of physical block
// block_tables[s * max_blocks_per_seq + p / block_size].
//
// Split in two, as FlashInfer's BatchPrefillWithPagedKVCache:
//  - PlanAttention (host, once per step, from the step's token_seq / token_pos on the host) cuts
//    the work into tiles and, when the tiles alone would leave the GPU idle, splits long KV ranges
//    into chunks (flash-decoding) whose partial results a second kernel merges. The plan is plain
//    data; UploadAttentionPlan copies its work lists into a device workspace the caller owns.
//  - PagedAttention (per layer) runs the plan on the layer's cache: up to three kernels on the
//    stream, nothing allocated.
//
// The work: consecutive tokens of one sequence form a segment; a segment's (token, query head)
// pairs for one KV head are its rows, token-major (row f: token f / group, head f % group of the
// GQA group), so the query heads that share a KV head share every K/V load. A tile is up to 64
// rows ("wide", prefill chunks) or up to 16 rows ("narrow", decode tokens and short chunks), run
// by one thread block of 128 threads per KV head, FlashAttention-2 style: the tile's queries stay
// in shared memory, K and V stream through it 32 positions at a time (read through the block
// table, F16 widened to float), and each row keeps an online softmax (running max and sum, in
// float, base 2) and its output accumulators in registers. Causality is per row, so one tile may
// hold tokens at any positions; warps whose rows all lie before a key tile skip it.
//
// Numerics: every product and sum in float; exp2 of scores prescaled by scale * log2(e). Results
// do not depend on the block size or on the block table's order; they do depend (at float
// rounding) on the plan's split, i.e. on the batch.
//
// Conventions (as elementwise.h's): pointers in PagedAttentionParams are device pointers, strides
// count elements; the caller keeps them valid until the stream has run the work. Entry points
// return cudaErrorInvalidValue, without launching, for parameters that cannot be run, else the
// launches' cudaGetLastError(). Positions and block ids are the caller's contract (checked one
// layer up). No state is kept: calls are thread-safe given distinct plans and workspaces.
//
// Headers under engine/cuda include nothing of the project but cuda_check.h, so they build on a
// bare GPU machine (scripts/gpu_check.sh).
#ifndef TANDEM_ENGINE_CUDA_PAGED_ATTENTION_H_
#define TANDEM_ENGINE_CUDA_PAGED_ATTENTION_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/cuda/cuda_check.h"
#include "engine/cuda/weight_type.h"

namespace tandem::cuda {


// The tiles' shapes (rows = (token, query head) pairs of one KV head; keys = cache positions).
inline constexpr int kAttentionWideRows = 64;
inline constexpr int kAttentionNarrowRows = 16;
inline constexpr int kAttentionKeysPerTile = 32;

struct PagedAttentionParams {
  // [num_tokens, num_heads, head_dim]: head h of token t at q + t * q_token_stride + h * head_dim.
  const float* q = nullptr;
  int64_t q_token_stride = 0;  // floats between tokens (>= num_heads * head_dim)
  // [num_tokens, num_heads, head_dim], at out + t * out_token_stride + h * head_dim. Written
  // only there (padding between tokens is left alone).
  float* out = nullptr;
  int64_t out_token_stride = 0;

  // One layer's K and V caches, same layout: element d of kv-head g at slot j of physical block b
  //   cache[b * block_stride + j * token_stride + g * kv_head_stride + d]   (head_dim contiguous)
  // in elements of kv_type: float (F32) or IEEE half bits (F16). For docs/kv_layout.md's pool:
  // k_cache = LayerKeys(l), v_cache = LayerValues(l), block_stride = L * 2 * B * H * D,
  // token_stride = H * D, kv_head_stride = D.
  // REQUIRES: both caches 16-byte aligned and the three strides multiples of 16 bytes (true of
  // that layout with head_dim 64 or 128); else cudaErrorInvalidValue.
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  KvCacheType kv_type = KvCacheType::kF16;
  int64_t block_stride = 0;    // elements
  int64_t token_stride = 0;    // elements
  int64_t kv_head_stride = 0;  // elements
  int64_t block_size = 0;      // tokens per block

  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq] physical block ids
  int64_t max_blocks_per_seq = 0;
  // [num_tokens] sequence index (row of block_tables) and position of each token: the device
  // copies of what PlanAttention read on the host (the same values). token_seq may be null: the
  // plan's work items carry each tile's sequence.
  const int32_t* token_seq = nullptr;
  const int32_t* token_pos = nullptr;

  int64_t num_tokens = 0;
  int64_t num_heads = 0;     // query heads; a multiple of num_kv_heads (GQA group = the ratio)
  int64_t num_kv_heads = 0;  // at most 65535
  int64_t head_dim = 0;      // 64 or 128; others: cudaErrorInvalidValue
  float scale = 0.0f;        // applied to q·k; 0 means 1 / sqrt(head_dim)
};

// What the plan reads: the step's token layout on the host, and the model's head shape.
struct AttentionPlanInput {
  const int32_t* token_seq = nullptr;  // host [num_tokens]; >= 0
  const int32_t* token_pos = nullptr;  // host [num_tokens]; >= 0
  int64_t num_tokens = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;  // 64 or 128
};

struct AttentionPlanOptions {
  // The device's multiprocessors (cudaDevAttrMultiProcessorCount; 132 on an H100 / H200).
  int num_sms = 132;
  // KV ranges are split until the grid has about num_sms * ctas_per_sm thread blocks.
  int ctas_per_sm = 2;
  // No chunk of a split KV range is shorter than this (positions; rounded up to a multiple of
  // kAttentionKeysPerTile). A huge value disables splitting.
  int min_kv_chunk = 256;
};

// One thread block's work (per KV head: the grid's y). Plain data, copied to the device as is.
struct AttentionWorkItem {
  int32_t seq = 0;          // row of block_tables
  int32_t first_token = 0;  // the segment's first token
  // Rows [row_begin, row_begin + rows) of the segment: row f is token first_token + f / group,
  // query head kv_head * group + f % group.
  int32_t row_begin = 0;
  int32_t rows = 0;
  int32_t kv_begin = 0;  // cache positions [kv_begin, kv_end) (each row stops at its own position)
  int32_t kv_end = 0;
  // -1: the tile's whole range; the result goes to `out`. Else a chunk of a split range: row r's
  // unnormalized accumulators, max and sum go to partial row (partial + r) (of each KV head).
  int32_t partial = -1;
  int32_t reserved = 0;
};

// One (token, query head within the group) of a split tile: its chunks' partial rows are
// first_partial + c * chunk_stride for c < num_chunks (of each KV head).
struct AttentionMergeRow {
  int32_t token = 0;
  int32_t head_in_group = 0;
  int32_t first_partial = 0;
  int32_t num_chunks = 0;
  int32_t chunk_stride = 0;
  int32_t reserved = 0;
};

// The partition of one step's attention. Plain data, valid for every layer of the step.
struct AttentionPlan {
  // The shape it was made for; PagedAttention refuses params of another.
  int64_t num_tokens = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;

  int64_t kv_chunk = 0;  // positions per chunk of a split range; 0: nothing is split
  std::vector<AttentionWorkItem> wide_items;    // tiles of up to 64 rows, longest first
  std::vector<AttentionWorkItem> narrow_items;  // tiles of up to 16 rows, longest first
  std::vector<AttentionMergeRow> merge_rows;    // rows of split tiles
  int64_t partial_rows = 0;                     // per KV head

  // The device workspace, in bytes from its start (each offset a multiple of 256):
  //   wide_items | narrow_items | merge_rows | partial accumulators
  //   [partial_rows, num_kv_heads, head_dim] float | partial (max, sum) [partial_rows,
  //   num_kv_heads, 2] float.
  size_t wide_offset = 0;
  size_t narrow_offset = 0;
  size_t merge_offset = 0;
  size_t partial_acc_offset = 0;
  size_t partial_ml_offset = 0;
  size_t workspace_bytes = 0;  // what the caller provides (256-byte aligned; may be 0)
};

// The partition rule:
//  1. Segments: maximal runs of consecutive tokens of the same sequence. A segment of R = tokens *
//     group rows is one narrow tile when R <= 16, else ceil(R / 64) wide tiles. A tile's KV range
//     is [0, 1 + the largest position of its tokens).
//  2. Split: with n tiles and target = num_sms * ctas_per_sm, when n * num_kv_heads < target, the
//     chunk c is the smallest multiple of 32 >= min_kv_chunk with
//     sum over tiles of ceil(len / c) * num_kv_heads <= target, and every tile longer than c runs
//     as ceil(len / c) chunks of c positions (the last shorter), merged afterwards. Otherwise (or
//     when c would not split any tile) nothing is split.
// Pure host code. cudaErrorInvalidValue for a null plan or input arrays with tokens present,
// non-positive head counts, num_heads not a multiple of num_kv_heads, head_dim other than 64 or
// 128, negative positions or sequence indices, or bad options.
cudaError_t PlanAttention(const AttentionPlanInput& input, const AttentionPlanOptions& options,
                          AttentionPlan* plan);

// Copies the plan's work lists into `workspace` (device memory of workspace_bytes >=
// plan.workspace_bytes, 256-byte aligned) on `stream`. The plan may be destroyed once this
// returns (pageable copies are staged before cudaMemcpyAsync returns). Once per step.
cudaError_t UploadAttentionPlan(const AttentionPlan& plan, void* workspace, size_t workspace_bytes,
                                cudaStream_t stream);

// Runs the plan for one layer: out = softmax(scale * q·kᵀ, causal) · v per (token, query head),
// query head h reading KV head h / (num_heads / num_kv_heads). `workspace` holds what
// UploadAttentionPlan put there, and receives the split chunks' partial results (so one call at
// a time per workspace). cudaErrorInvalidValue, without launching, when the params do not match
// the plan's shape, head_dim is not 64 or 128, kv_type is unknown, pointers are null with tokens
// present, the caches or strides are not 16-byte aligned, or the workspace is smaller than the
// plan's.
cudaError_t PagedAttention(const PagedAttentionParams& params, const AttentionPlan& plan,
                           void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_ENGINE_CUDA_PAGED_ATTENTION_H_
