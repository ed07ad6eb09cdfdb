// The CPU backend (backend.h): the Llama-family forward pass -- RMSNorm, RoPE, grouped-query
// attention over paged KV blocks, SwiGLU MLP, and Gemma's variants (GeGLU, post norms,
// soft-capping, per-layer windows) -- with the kernels of engine/cpu, a layer at a time.
//
//   ASSIGN_OR_RETURN(LoadedModel model, LoadGgufModel(path));
//   ASSIGN_OR_RETURN(auto backend, CpuBackend::Create(&model, {.num_threads = 4}));
//   ASSIGN_OR_RETURN(auto kv, KvStorage::Create(backend->KvLayoutFor(/*num_blocks=*/256)));
//   StepOutput out;
//   RETURN_IF_ERROR(backend->Step(batch, kv.get(), &out));
//
// Not thread-safe: one thread drives a step at a time (the kernels use the internal thread pool).
#ifndef TANDEM_ENGINE_RUNTIME_CPU_BACKEND_H_
#define TANDEM_ENGINE_RUNTIME_CPU_BACKEND_H_

#include <initializer_list>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/cpu/cpu_features.h"
#include "engine/cpu/matmul.h"
#include "engine/cpu/packed_weights.h"
#include "engine/cpu/rope.h"
#include "engine/cpu/thread_pool.h"
#include "engine/kv/kv_storage.h"
#include "engine/model/model_loader.h"
#include "engine/runtime/backend.h"
#include "engine/runtime/step.h"

namespace tandem {

class CpuBackend final : public Backend {
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
    // Packed copies larger than the file's bytes (any form: a last tile's padding rows; kQ6x16
    // with an odd number of super-blocks a row: 32 bytes a tile) may add at most this much
    // memory in all; the matrices past it run on the row kernels from the mapped file. Packed
    // copies the size of the file's bytes (whole tiles, and for Q6_K an even number of
    // super-blocks a row, as every Llama shape has) replace those bytes in memory and are always
    // made.
    int64_t max_packed_excess_bytes = int64_t{24} << 20;
    // In a step of kPrefetchKvMinTokens..kPrefetchKvMaxTokens tokens (a decode batch), let the
    // products before each layer's attention bring its KV rows into the cache (cpu::MatMulShared's
    // `prefetch`): those products are bound by arithmetic then, and attention would otherwise
    // wait on memory for every row. Results are identical either way.
    bool prefetch_kv = true;
    // A layer's attention output projection and MLP run over the step's tokens in passes of
    // this many rows (a multiple of kMlpRowAlign), so their gate / up activations ([rows, ffn]
    // floats each), output rows and quantized copies stay within a size independent of the
    // prompt chunk's length: at a 1B shape a 512-token step would otherwise hold 2 x 512 x 8192
    // floats for gate / up alone (32 MiB; 56 MiB at 8B). Results are bit-identical for any value
    // (every row's products are computed alone, and the residual adds are the same operations).
    // 0: as many rows as fit kMlpScratchBytes, at least kMlpMinRows.
    int64_t mlp_rows_per_pass = 0;
  };
  static constexpr int64_t kMlpScratchBytes = int64_t{4} << 20;
  static constexpr int64_t kMlpMinRows = 64;
  static constexpr int64_t kMlpRowAlign = 16;
  static constexpr int64_t kPrefetchKvMinTokens = 4;
  static constexpr int64_t kPrefetchKvMaxTokens = 64;

  // `model` must outlive the returned object. Small tensors (norms, biases, RoPE factors) are
  // converted to float once here. Quantized matrices are repacked here (Options::pack_weights;
  // their pages of a mapped GGUF file are then let go) and the others used in place.
  // UNIMPLEMENTED when the model needs what the backend lacks (CheckSupport).
  static absl::StatusOr<std::unique_ptr<CpuBackend>> Create(const LoadedModel* model,
                                                            const Options& options);
  // Every weight type, any head dimension, F32 and F16 KV, in host memory.
  static const BackendSupport& Support();

  const BackendSupport& support() const override { return Support(); }
  const ModelConfig& config() const override { return model_->config; }
  KvLayout KvLayoutFor(int64_t num_blocks) const override;

  absl::Status Plan(const StepBatch& batch, const KvStorage& kv) override;
  absl::Status Embed(const TensorDump& dump) override;
  absl::Status RunLayer(int64_t layer, KvStorage* kv, const TensorDump& dump) override;
  absl::Status Finish(StepOutput* out, const TensorDump& dump) override;

 private:
  struct SmallLayer {
    std::vector<float> attn_norm, ffn_norm, q_bias, k_bias, v_bias;
    std::vector<float> q_norm, k_norm;  // [head_dim] when ModelConfig::qk_norm, else empty
    // [hidden] when ModelConfig::post_norms (Gemma 2/3), else empty.
    std::vector<float> attn_post_norm, ffn_post_norm;
    int64_t window = 0;         // ModelConfig::LayerWindow
    bool sliding_rope = false;  // RoPE with inv_freq_sliding_ (ModelConfig::rope_theta_sliding)
  };
  CpuBackend(const LoadedModel* model, const Options& options);
  absl::Status Init();
  absl::Status Linear(const float* x, int64_t rows, const GgufTensor& w, float* y,
                      const cpu::MatMulExtras& extras = {});
  // Products of the same activations (Q/K/V, gate/up) in one kernel call: one quantization of
  // `x` and one pass over the thread pool.
  absl::Status LinearShared(const float* x, int64_t rows,
                            std::initializer_list<std::pair<const GgufTensor*, float*>> products,
                            const cpu::MatMulExtras& extras);
  // out = norm(in) over `rows` rows; with `residual`, residual += in first and out = its norm.
  void Norm(const float* in, const std::vector<float>& weight, float* out, int64_t rows,
            float* residual = nullptr) const;
  // out = norm(x) over `rows` rows (of hidden_size floats); with `proj`, x += proj first, proj
  // first normalized with `proj_norm` unless it is empty (Gemma's post norms).
  void AddNorm(const std::vector<float>& weight, float* proj, const std::vector<float>& proj_norm,
               float* x, float* out, int64_t rows) const;
  // RoPE on `y` ([T, heads, head_dim]) at the step's positions, with layer `l`'s frequencies.
  void Rope(std::vector<float>& y, int64_t heads, int64_t l);
  // Per-head RMSNorm of `y` ([T, heads, head_dim]) in place, with `weight` ([head_dim]); nothing
  // when `weight` is empty.
  void HeadNorm(std::vector<float>& y, int64_t heads, const std::vector<float>& weight) const;
  // The KV rows layer `l`'s attention reads, for prefetching (Options::prefetch_kv).
  void CollectKvRows(int64_t l, const KvStorage& kv);
  // Layer `l` up to its attention output (scratch_.h): Q/K/V, RoPE, the step's K/V into
  // `kv` (then the batch's on_layer_done), paged attention.
  absl::Status Attention(int64_t l, KvStorage* kv, const TensorDump& dump);
  // Its output projection and MLP, in passes of pass_rows_ rows; leaves the last product in
  // scratch_.proj for the next norm to add when the step is one pass.
  absl::Status Mlp(int64_t l, const KvStorage& kv, const TensorDump& dump);
  absl::Status PackWeights();
  // The packed copy of `w`, or nullptr.
  const cpu::PackedWeights* PackedFor(const GgufTensor* w) const;

  const LoadedModel* model_;
  Options options_;
  std::unique_ptr<cpu::ThreadPool> pool_;
  cpu::RopeStyle rope_style_ = cpu::RopeStyle::kInterleaved;
  std::vector<float> inv_freq_;  // [head_dim / 2]
  float rope_scale_ = 1.0f;      // cos/sin multiplier with inv_freq_ (LongRoPE's attn_factor)
  // [head_dim / 2] for the windowed layers when ModelConfig::rope_theta_sliding is set, else empty.
  std::vector<float> inv_freq_sliding_;
  std::vector<float> output_norm_;
  std::vector<SmallLayer> layers_;
  std::unordered_map<const GgufTensor*, cpu::PackedWeights> packed_;
  // One token row of a tied embedding read back from its packed copy (Embed); empty when the
  // rows come from the file.
  std::vector<uint8_t> embd_row_;
  // The step in progress (Plan .. Finish), and its working buffers, kept between steps (their
  // capacity follows the largest step so far).
  StepPlan plan_;
  struct Scratch {
    // h: a norm's output, and between attention and its output projection attention's output.
    // gate, up, proj: one MLP pass's rows; normed: the MLP's norm when a step takes several.
    std::vector<float> x, h, q, k, v, gate, up, proj, normed, rope_cos_sin, last;
    std::vector<float> rope_cos_sin_sliding;  // with inv_freq_sliding_, when it is set
    std::vector<cpu::MemoryRange> kv_rows;  // what the next layer's attention reads
  };
  Scratch scratch_;
  bool prefetch_kv_ = false;  // Options::prefetch_kv applies to this step's size
  int64_t mlp_rows_ = 0;      // Options::mlp_rows_per_pass, resolved
  int64_t pass_rows_ = 0;     // the MLP's rows per pass in this step (Embed)
  // Of scratch_.kv_rows, those the next Q/K/V product prefetches.
  absl::Span<const cpu::MemoryRange> kv_rows_left_;
  // scratch_.proj holds the last product's output until its residual add into x, which runs
  // inside the next product's prepare_rows (fused with the norm that reads x).
  bool proj_pending_ = false;
};

}  // namespace tandem

#endif  // TANDEM_ENGINE_RUNTIME_CPU_BACKEND_H_
