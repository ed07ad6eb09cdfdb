// The seam between the engine and a compute backend (CpuBackend today; a CUDA backend beside it).
// A backend holds the model's weights in the form it computes with (repacked or uploaded once),
// says what it supports, owns the memory its KV pool lives in, and computes a step in two phases,
// in the plan/run style of FlashInfer: the host plans the step once (checks, the flattened batch,
// positions, block tables; a GPU backend uploads them and schedules attention here), then the
// layers run one by one on that plan.
//
//   RETURN_IF_ERROR(backend->Plan(batch, *kv));         // once per step, on the host
//   RETURN_IF_ERROR(backend->Embed(dump));              // the step's token embeddings
//   for (int64_t l = 0; l < backend->config().num_layers; ++l) {
//     RETURN_IF_ERROR(backend->RunLayer(l, kv, dump));  // calls batch.on_layer_done(l) as soon
//   }                                                   // as layer l's K/V are in `kv`
//   RETURN_IF_ERROR(backend->Finish(&out, dump));       // final norm and the logits asked for
//
// Step() runs the four. A backend is not thread-safe: one thread drives it. The batch given to
// Plan must outlive the step (until Finish returns).
#ifndef TANDEM_ENGINE_RUNTIME_BACKEND_H_
#define TANDEM_ENGINE_RUNTIME_BACKEND_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/core/dtype.h"
#include "engine/kv/kv_storage.h"
#include "engine/model/model_loader.h"
#include "engine/runtime/step.h"

namespace tandem {

// What a backend can run. CheckSupport compares a model against it before a backend is built.
struct BackendSupport {
  std::string name;                 // "cpu", "cuda"
  std::vector<DType> weight_types;  // of the matrices, multiplied as stored
  std::vector<DType> kv_types;      // of the KV pool
  std::vector<int64_t> head_dims;   // of attention; empty: any
  bool kv_on_device = false;        // the KV pool is in accelerator memory (not host-addressable)
  // Runs Gemma's changes to the layer (ModelConfig: embedding_scale, the GELU-gated FFN, post
  // norms, attention_scale, the soft-caps, per-layer windows and RoPE bases). A backend without
  // them (the CUDA kernels have none yet) refuses Gemma models by name.
  bool gemma_layers = false;
  // Applies LongRoPE (RopeScaling::kLongRope: per-pair frequency factors and a cos/sin scale).
  // The CUDA RoPE kernels do not scale cos/sin when they compute their own angles.
  bool long_rope = false;
};

// UNIMPLEMENTED, naming the backend and what it lacks (a matrix's type, the head dimension, the
// KV type, a Gemma feature), when `support` cannot run `model` with a KV pool of `kv_type`.
absl::Status CheckSupport(const BackendSupport& support, const LoadedModel& model, DType kv_type);

// A step flattened for the kernels: token t of the step belongs to sequence token_seq[t], at
// position token_pos[t]. Every backend plans a step the same way (PlanStep); a GPU backend copies
// this to the device.
struct StepPlan {
  int64_t num_tokens = 0;     // T
  int64_t num_sequences = 0;  // S
  std::vector<int32_t> token_ids;  // [T]
  std::vector<int32_t> token_seq;  // [T]
  std::vector<int32_t> token_pos;  // [T]
  // [S]: positions each sequence attends to once this step's tokens are in (start + tokens).
  std::vector<int32_t> seq_lens;
  // [S, max_blocks_per_seq]: sequence s's physical blocks in position order, zero-padded.
  std::vector<int32_t> block_tables;
  int64_t max_blocks_per_seq = 0;
  // Rows of the step's tokens whose logits are returned (a sequence's last token when it asks,
  // every token of a sequence with all_logits).
  std::vector<int64_t> logit_rows;
  // The batch's layer callback (may be empty); valid until the step ends.
  const std::function<void(int64_t layer)>* on_layer_done = nullptr;
};

// Checks `batch` against the model and the KV layout and fills `plan` (its vectors keep their
// capacity from step to step). INVALID_ARGUMENT for an empty batch or sequence, a token id
// outside the vocabulary, a position past the context, a block table that does not cover the
// positions or names a block outside the pool, or a KV layout that does not match the model.
absl::Status PlanStep(const ModelConfig& config, const StepBatch& batch, const KvLayout& kv,
                      StepPlan* plan);

class Backend {
 public:
  virtual ~Backend() = default;

  virtual const BackendSupport& support() const = 0;
  virtual const ModelConfig& config() const = 0;
  // A KV layout with `num_blocks` blocks that fits this model and backend.
  virtual KvLayout KvLayoutFor(int64_t num_blocks) const = 0;
  // The memory the KV pool lives in when the caller brings none (a transport's): the heap for
  // the CPU (an empty allocator), device memory for a GPU.
  virtual KvAllocator KvMemory() { return {}; }

  // The phases of a step, as above. Plan's errors are PlanStep's; the others fail only for a
  // backend error (a kernel, the device), which ends every request of the step.
  virtual absl::Status Plan(const StepBatch& batch, const KvStorage& kv) = 0;
  virtual absl::Status Embed(const TensorDump& dump) = 0;
  // REQUIRES: Plan and Embed ran for this step, and RunLayer for every layer before `layer`.
  virtual absl::Status RunLayer(int64_t layer, KvStorage* kv, const TensorDump& dump) = 0;
  // Fills `out` with the logits of the sequences that asked for them, in batch order.
  virtual absl::Status Finish(StepOutput* out, const TensorDump& dump) = 0;

  // The whole step: writes the K/V of every token of `batch` into `kv` at its positions, and
  // fills `out`. `dump`, when set, receives every named intermediate tensor (step.h).
  absl::Status Step(const StepBatch& batch, KvStorage* kv, StepOutput* out,
                    const TensorDump& dump = nullptr);
};

}  // namespace tandem

#endif  // TANDEM_ENGINE_RUNTIME_BACKEND_H_
