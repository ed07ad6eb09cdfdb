// One forward step of a batch, as every backend takes it: prefill chunks and single decode tokens
// of different sequences mixed in one call.
#ifndef TANDEM_ENGINE_RUNTIME_STEP_H_
#define TANDEM_ENGINE_RUNTIME_STEP_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tandem {

// The part of one sequence computed in this step.
struct StepSequence {
  // Token ids at positions start_position .. start_position + tokens.size() - 1: a prefill chunk,
  // or one token when decoding. Not empty.
  absl::Span<const int32_t> tokens;
  // Positions 0 .. start_position - 1 are already in the KV cache.
  int64_t start_position = 0;
  // Physical KV blocks of the sequence in position order; must cover every position up to the
  // last token of this step.
  absl::Span<const int32_t> block_table;
  // Whether to return the logits after the last token (false for a prefill chunk that is not the
  // prompt's last).
  bool compute_logits = true;
  // Return the logits after every token of this step, not only the last (scoring a prompt:
  // row i predicts the token after tokens[i]). Implies compute_logits.
  bool all_logits = false;
};

struct StepBatch {
  std::vector<StepSequence> sequences;
  // Called with each layer index as soon as that layer's K/V of every token of the step are in
  // the cache (before the layer's attention runs), so a transfer of the layer can start while the
  // later layers are computed. On the stepping thread; it must not block.
  std::function<void(int64_t layer)> on_layer_done;
};

// Called with each named intermediate tensor, [rows, cols] floats, row-major, valid only during the
// call. Names follow llama.cpp's graph ("attn_norm-0", "Qcur-0", "Kcur-0", "Vcur-0", "kqv_out-0",
// "ffn_inp-0", "ffn_norm-0", "ffn_out-0", "l_out-0", "result_norm", "result_output") so dumps can
// be compared with a reference layer by layer. Rows are the step's tokens in batch order.
using TensorDump =
    std::function<void(absl::string_view name, const float* data, int64_t rows, int64_t cols)>;

struct StepOutput {
  // [rows, vocab_size], in batch order: one row per sequence with compute_logits, or one per
  // token of a sequence with all_logits.
  std::vector<float> logits;
  int64_t vocab_size = 0;
  const float* Logits(int64_t i) const { return logits.data() + i * vocab_size; }
};

}  // namespace tandem

#endif  // TANDEM_ENGINE_RUNTIME_STEP_H_
