// The Llama-family forward pass on the CPU: RMSNorm, RoPE, grouped-query attention over paged KV
// blocks, SwiGLU MLP, with the kernels of engine/cpu.
//
//   ASSIGN_OR_RETURN(LoadedModel model, LoadGgufModel(path));
//   ASSIGN_OR_RETURN(auto forward, CpuForward::Create(&model, {.num_threads = 4}));
//   ASSIGN_OR_RETURN(auto kv, KvStorage::Create(forward->KvLayoutFor(/*num_blocks=*/256)));
//   StepOutput out;
//   RETURN_IF_ERROR(forward->Step(batch, kv.get(), &out));
//
// Not thread-safe: one thread drives Step at a time (the kernels use the internal thread pool).
#ifndef TANDEM_ENGINE_RUNTIME_CPU_FORWARD_H_
#define TANDEM_ENGINE_RUNTIME_CPU_FORWARD_H_

#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/cpu/cpu_features.h"
#include "engine/cpu/matmul.h"
#include "engine/cpu/packed_weights.h"
#include "engine/cpu/rope.h"
#include "engine/cpu/thread_pool.h"
#include "engine/kv/kv_storage.h"
#include "engine/model/model_loader.h"
#include "engine/runtime/step.h"

namespace tandem {

class CpuForward {
 public:
  struct Options {
    // Threads for the kernels, the calling thread included. 0: all cores.
    int num_threads = 0;
    // Tokens per KV block for KvLayoutFor().
    int64_t block_size = 16;
    // KV element type for KvLayoutFor(): F16 (half the memory and transfer bytes; attention
    // widens as it reads) or F32. Step() takes a pool of either.
    DType kv_dtype = DType::kF16;
    // Kernel instruction set; empty: the best the CPU has (or TANDEM_CPU_ISA).
    std::optional<cpu::Isa> isa = std::nullopt;
    // Repack quantized matrices at start-up for the packed kernels (engine/cpu/packed_weights.h),
    // where the ISA has its own. Results differ from the row kernels' in float rounding only.
    bool pack_weights = true;
    // In a step of kPrefetchKvMinTokens..kPrefetchKvMaxTokens tokens (a decode batch), let the
    // products before each layer's attention bring its KV rows into the cache (cpu::MatMulShared's
    // `prefetch`): those products are bound by arithmetic then, and attention would otherwise
    // wait on memory for every row. Results are identical either way.
    bool prefetch_kv = true;
  };
  static constexpr int64_t kPrefetchKvMinTokens = 4;
  static constexpr int64_t kPrefetchKvMaxTokens = 64;

  // `model` must outlive the returned object. Small tensors (norms, biases, RoPE factors) are
  // converted to float once here. Quantized matrices are repacked here (Options::pack_weights;
  // their pages of a mapped GGUF file are then let go) and the others used in place.
  static absl::StatusOr<std::unique_ptr<CpuForward>> Create(const LoadedModel* model,
                                                            const Options& options);

  const ModelConfig& config() const { return model_->config; }
  // A KV layout with `num_blocks` blocks that fits this model.
  KvLayout KvLayoutFor(int64_t num_blocks) const;

  // Runs one step: writes the K/V of every token of `batch` into `kv` at its positions, and fills
  // `out` with the logits of the sequences that asked for them. INVALID_ARGUMENT for an empty
  // sequence, a token id outside the vocabulary, a position past the model's context, a block
  // table that does not cover the positions or names a block outside `kv`, or a KV layout that
  // does not match the model. `dump`, when set, receives every named intermediate tensor.
  absl::Status Step(const StepBatch& batch, KvStorage* kv, StepOutput* out,
                    const TensorDump& dump = nullptr);

 private:
  struct SmallLayer {
    std::vector<float> attn_norm, ffn_norm, q_bias, k_bias, v_bias;
  };
  CpuForward(const LoadedModel* model, const Options& options);
  absl::Status Init();
  absl::Status Validate(const StepBatch& batch, const KvStorage& kv) const;
  absl::Status Linear(const float* x, int64_t rows, const GgufTensor& w, float* y,
                      const cpu::MatMulExtras& extras = {});
  absl::Status PackWeights();
  // The packed copy of `w`, or nullptr.
  const cpu::PackedWeights* PackedFor(const GgufTensor* w) const;

  const LoadedModel* model_;
  Options options_;
  std::unique_ptr<cpu::ThreadPool> pool_;
  cpu::RopeStyle rope_style_ = cpu::RopeStyle::kInterleaved;
  std::vector<float> inv_freq_;  // [head_dim / 2]
  std::vector<float> output_norm_;
  std::vector<SmallLayer> layers_;
  std::unordered_map<const GgufTensor*, cpu::PackedWeights> packed_;
  // Step()'s working buffers, kept between steps (their capacity follows the largest step so far).
  struct Scratch {
    std::vector<int32_t> token_ids, token_seq, token_pos, tables;
    std::vector<int64_t> logit_rows;
    std::vector<float> x, h, q, k, v, attn, gate, up, proj, rope_cos_sin, last;
    std::vector<cpu::MemoryRange> kv_rows;  // what the next layer's attention reads
  };
  Scratch scratch_;
};

}  // namespace tandem

#endif  // TANDEM_ENGINE_RUNTIME_CPU_FORWARD_H_
