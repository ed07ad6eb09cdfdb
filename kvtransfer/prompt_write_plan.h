// Which block writes carry a prompt's K/V to the decode worker's pool while a prefill worker's
// engine computes it, layer by layer, in one or more steps (chunked prefill, recompute after a
// preemption).
//
//   PromptWritePlan plan({.block_size = 16, .num_layers = 30,
//                         .destination_cached_tokens = 32, .destination_blocks = dst});
//   request.on_kv_layer = [&](const KvLayerDone& d) {
//     for (WriteOp& op : plan.OnLayer(d.layer, d.first_position, d.num_tokens, d.block_table))
//       connection->Write(op, deadline, ...);
//   };
//
// Blocks the destination already caches are never written. Blocks this worker took from its own
// prefix cache (not computed here) are written whole, every layer, once, with the first layer of
// the step that follows them. A block computed across two steps is written again, for each
// layer, by the later step (its earlier slots unchanged).
//
// Not thread-safe; one plan per request, called from the engine thread.
#ifndef TANDEM_KVTRANSFER_PROMPT_WRITE_PLAN_H_
#define TANDEM_KVTRANSFER_PROMPT_WRITE_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvtransfer/kv_transport.h"

namespace tandem::kvtransfer {

class PromptWritePlan {
 public:
  struct Options {
    int64_t block_size = 16;
    int64_t num_layers = 1;
    // Leading prompt tokens whose K/V the destination holds already; a multiple of block_size.
    int64_t destination_cached_tokens = 0;
    // The destination's block for each of the prompt's logical blocks, in order.
    std::vector<int32_t> destination_blocks;
  };

  // INVALID_ARGUMENT for a non-positive block size or layer count, or cached tokens that are
  // negative, not whole blocks, or beyond the destination's blocks.
  static absl::StatusOr<PromptWritePlan> Create(Options options);

  // The writes for `layer` of a step that computed positions
  // [first_position, first_position + num_tokens); `source_blocks` is the request's block table
  // (logical order). Empty when nothing is to be written. REQUIRES: the positions fit in both
  // `source_blocks` and the destination's blocks; layer in [0, num_layers).
  std::vector<WriteOp> OnLayer(int64_t layer, int64_t first_position, int64_t num_tokens,
                               absl::Span<const int32_t> source_blocks);

  // Leading positions whose K/V of every layer has been planned.
  int64_t planned_tokens() const { return planned_tokens_; }

 private:
  explicit PromptWritePlan(Options options);
  // Blocks [from, to), layers [first_layer, first_layer + num_layers), or nothing when empty.
  void Append(absl::Span<const int32_t> source_blocks, int64_t from, int64_t to,
              int64_t first_layer, int64_t num_layers, std::vector<WriteOp>* ops) const;

  Options options_;
  int64_t planned_tokens_;
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_PROMPT_WRITE_PLAN_H_
