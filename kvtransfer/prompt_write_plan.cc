#include "kvtransfer/prompt_write_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace tandem::kvtransfer {

absl::StatusOr<PromptWritePlan> PromptWritePlan::Create(Options options) {
  if (options.block_size <= 0 || options.num_layers <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("block size ", options.block_size,
                                                   " and layer count ", options.num_layers,
                                                   " must be positive"));
  }
  const int64_t cached = options.destination_cached_tokens;
  const int64_t capacity =
      static_cast<int64_t>(options.destination_blocks.size()) * options.block_size;
  if (cached < 0 || cached % options.block_size != 0 || cached > capacity) {
    return absl::InvalidArgumentError(
        absl::StrCat("destination cached tokens ", cached, " must be whole blocks of ",
                     options.block_size, " within the destination's ", capacity, " slots"));
  }
  return PromptWritePlan(std::move(options));
}

PromptWritePlan::PromptWritePlan(Options options)
    : options_(std::move(options)), planned_tokens_(options_.destination_cached_tokens) {}

void PromptWritePlan::Append(absl::Span<const int32_t> source_blocks, int64_t from, int64_t to,
                             int64_t first_layer, int64_t num_layers,
                             std::vector<WriteOp>* ops) const {
  if (from >= to) return;
  CHECK(to <= static_cast<int64_t>(source_blocks.size()) &&
        to <= static_cast<int64_t>(options_.destination_blocks.size()))
      << "blocks [" << from << ", " << to << ") outside the source's " << source_blocks.size()
      << " or the destination's " << options_.destination_blocks.size();
  WriteOp op{.blocks = {}, .first_layer = static_cast<int32_t>(first_layer),
             .num_layers = static_cast<int32_t>(num_layers)};
  op.blocks.reserve(static_cast<size_t>(to - from));
  for (int64_t k = from; k < to; ++k) {
    op.blocks.push_back({.src = source_blocks[static_cast<size_t>(k)],
                         .dst = options_.destination_blocks[static_cast<size_t>(k)]});
  }
  ops->push_back(std::move(op));
}

std::vector<WriteOp> PromptWritePlan::OnLayer(int64_t layer, int64_t first_position,
                                              int64_t num_tokens,
                                              absl::Span<const int32_t> source_blocks) {
  CHECK(layer >= 0 && layer < options_.num_layers) << "layer " << layer;
  const int64_t bs = options_.block_size;
  const int64_t dst_cached_blocks = options_.destination_cached_tokens / bs;
  std::vector<WriteOp> ops;
  // Positions before this step that no step of this plan computed came from this worker's
  // prefix cache (whole blocks): sent whole, with the step's first layer.
  if (layer == 0 && first_position > planned_tokens_) {
    Append(source_blocks, std::max(dst_cached_blocks, planned_tokens_ / bs), first_position / bs,
           0, options_.num_layers, &ops);
  }
  const int64_t end = first_position + num_tokens;
  Append(source_blocks, std::max(dst_cached_blocks, first_position / bs), (end + bs - 1) / bs,
         layer, 1, &ops);
  if (layer == options_.num_layers - 1) planned_tokens_ = std::max(planned_tokens_, end);
  return ops;
}

}  // namespace tandem::kvtransfer
