#include "engine/runtime/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <numbers>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/cpu/elementwise.h"
#include "engine/cpu/matmul.h"
#include "engine/cpu/paged_attention.h"
#include "engine/cpu/rms_norm.h"

namespace tandem {
namespace {

static_assert(CpuBackend::kPrefetchKvMaxTokens <= CpuBackend::kMlpMinRows,
              "a step that prefetches KV rows runs its MLP in one pass");

std::vector<float> ToFloat(const GgufTensor* t) {
  if (t == nullptr) return {};
  std::vector<float> out(static_cast<size_t>(t->elements()));
  DequantizeReference(t->type, t->data, out.data(), t->elements());
  return out;
}

// Llama 3.1's frequency-dependent RoPE scaling (Hugging Face's "llama3" rope_type).
void ApplyLlama3Scaling(const RopeScaling& s, std::vector<float>* inv_freq) {
  const double old_context = static_cast<double>(s.original_max_position);
  const double low_wavelen = old_context / s.low_freq_factor;
  const double high_wavelen = old_context / s.high_freq_factor;
  for (float& f : *inv_freq) {
    const double freq = f;
    const double wavelen = 2 * std::numbers::pi / freq;
    if (wavelen < high_wavelen) continue;
    if (wavelen > low_wavelen) {
      f = static_cast<float>(freq / s.factor);
    } else {
      const double smooth =
          (old_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      f = static_cast<float>((1 - smooth) * freq / s.factor + smooth * freq);
    }
  }
}

}  // namespace

CpuBackend::CpuBackend(const LoadedModel* model, const Options& options)
    : model_(model), options_(options) {}

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(const LoadedModel* model,
                                                               const Options& options) {
  if (model == nullptr || model->weights.token_embd == nullptr) {
    return absl::InvalidArgumentError("CpuBackend needs a loaded model");
  }
  RETURN_IF_ERROR(CheckSupport(Support(), *model, options.kv_dtype));
  if (options.block_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("block_size must be positive, got ",
                                                   options.block_size));
  }
  auto forward = std::unique_ptr<CpuBackend>(new CpuBackend(model, options));
  RETURN_IF_ERROR(forward->Init());
  return forward;
}

absl::Status CpuBackend::Init() {
  const ModelConfig& c = model_->config;
  RETURN_IF_ERROR(c.Validate());
  pool_ = std::make_unique<cpu::ThreadPool>(cpu::ThreadPool::Options{.num_threads = options_.num_threads});
  rope_style_ = c.rope_neox ? cpu::RopeStyle::kNeox : cpu::RopeStyle::kInterleaved;

  inv_freq_.resize(static_cast<size_t>(c.head_dim / 2));
  cpu::RopeInvFreq(c.rope_theta, c.head_dim, inv_freq_.data());
  if (model_->weights.rope_freqs != nullptr) {
    // Per-frequency divisors stored in the file (llama.cpp's form of Llama 3.1 scaling).
    const std::vector<float> factors = ToFloat(model_->weights.rope_freqs);
    if (factors.size() != inv_freq_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("rope_freqs has ", factors.size(),
                                                     " entries, expected ", inv_freq_.size()));
    }
    for (size_t i = 0; i < factors.size(); ++i) inv_freq_[i] /= factors[i];
  } else if (c.rope_scaling.type == RopeScaling::Type::kLongRope) {
    // Phi-3's LongRoPE: per-pair divisors, one list for the whole load (UsesLongRopeFactors),
    // and an attention factor on cos/sin. Validate() checked the lists.
    const std::vector<float>& factors = c.UsesLongRopeFactors() ? c.rope_scaling.long_factors
                                                                : c.rope_scaling.short_factors;
    for (size_t i = 0; i < inv_freq_.size(); ++i) inv_freq_[i] /= factors[i];
    rope_scale_ = c.rope_scaling.attn_factor;
  } else if (c.rope_scaling.type == RopeScaling::Type::kLlama3) {
    ApplyLlama3Scaling(c.rope_scaling, &inv_freq_);
  } else if (c.rope_scaling.type == RopeScaling::Type::kLinear) {
    for (float& f : inv_freq_) f /= c.rope_scaling.factor;
  }
  if (c.rope_theta_sliding > 0.0f) {
    // Gemma 3's windowed layers: their own base, and no scaling.
    inv_freq_sliding_.resize(inv_freq_.size());
    cpu::RopeInvFreq(c.rope_theta_sliding, c.head_dim, inv_freq_sliding_.data());
  }

  output_norm_ = ToFloat(model_->weights.output_norm);
  layers_.resize(static_cast<size_t>(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& w = model_->weights.layers[static_cast<size_t>(l)];
    SmallLayer& s = layers_[static_cast<size_t>(l)];
    s.attn_norm = ToFloat(w.attn_norm);
    s.ffn_norm = ToFloat(w.ffn_norm);
    s.q_bias = ToFloat(w.attn_q_bias);
    s.k_bias = ToFloat(w.attn_k_bias);
    s.v_bias = ToFloat(w.attn_v_bias);
    s.q_norm = ToFloat(w.attn_q_norm);
    s.k_norm = ToFloat(w.attn_k_norm);
    s.attn_post_norm = ToFloat(w.attn_post_norm);
    s.ffn_post_norm = ToFloat(w.ffn_post_norm);
    s.window = c.LayerWindow(l);
    s.sliding_rope = !inv_freq_sliding_.empty() && s.window > 0;
  }
  if (options_.mlp_rows_per_pass < 0 || options_.mlp_rows_per_pass % kMlpRowAlign != 0) {
    return absl::InvalidArgumentError(absl::StrCat("mlp_rows_per_pass must be a multiple of ",
                                                   kMlpRowAlign, ", got ",
                                                   options_.mlp_rows_per_pass));
  }
  mlp_rows_ = options_.mlp_rows_per_pass;
  if (mlp_rows_ == 0) {
    const int64_t fit = kMlpScratchBytes / (2 * c.intermediate_size * int64_t{sizeof(float)});
    mlp_rows_ = std::max(kMlpMinRows, fit / kMlpRowAlign * kMlpRowAlign);
  }
  if (options_.pack_weights) RETURN_IF_ERROR(PackWeights());
  return absl::OkStatus();
}

absl::Status CpuBackend::PackWeights() {
  const cpu::Isa isa = options_.isa.value_or(cpu::ActiveIsa());
  std::vector<const GgufTensor*> matrices;
  for (const LayerWeights& lw : model_->weights.layers) {
    matrices.insert(matrices.end(), {lw.attn_q, lw.attn_k, lw.attn_v, lw.attn_output, lw.ffn_gate,
                                     lw.ffn_up, lw.ffn_down});
  }
  // The output matrix last: it multiplies only the rows that want logits, so it is the first to
  // leave to the row kernels when the excess allowance runs out.
  matrices.push_back(model_->weights.output);
  int64_t excess_left = options_.max_packed_excess_bytes;
  for (const GgufTensor* t : matrices) {
    if (t == nullptr || t->shape.size() != 2 || packed_.contains(t)) continue;
    const std::optional<cpu::PackedFormat> format = cpu::PackedWeights::FormatFor(t->type);
    if (!format.has_value() || !cpu::PackedKernelIsNative(*format, isa)) {
      continue;
    }
    const int64_t excess =
        cpu::PackedWeights::PackedBytes(t->type, t->shape[1], t->shape[0]) - t->bytes;
    if (excess > 0) {
      if (excess > excess_left) continue;
      excess_left -= excess;
    }
    // The source rows' pages go as soon as they are packed, not after the whole matrix: at
    // 128256 x 2048 an embedding matrix's file pages and its packed copy would otherwise both be
    // resident at the end of its packing, the peak of the process.
    const int64_t row_bytes = *DTypeStorageBytes(t->type, t->shape[0]);
    auto drop_rows = [&](int64_t rows) {
      if (model_->file != nullptr) model_->file->DropPages(*t, rows * row_bytes);
    };
    absl::StatusOr<cpu::PackedWeights> packed = cpu::PackedWeights::Pack(
        t->data, t->type, t->shape[1], t->shape[0], /*w_row_bytes=*/0, drop_rows);
    // A matrix whose copy cannot be allocated runs on the row kernels from the mapped file.
    if (packed.status().code() == absl::StatusCode::kResourceExhausted) continue;
    if (!packed.ok()) {
      return absl::Status(packed.status().code(),
                          absl::StrCat(t->name, ": ", packed.status().message()));
    }
    // The packed copy replaces the file's bytes in memory (dropped above as it was made); an
    // embedding matrix tied to the output reads a few rows a step, which come back from the page
    // cache.
    packed_.emplace(t, *std::move(packed));
  }
  // A tied embedding in a format that gives its rows back (PackedWeights::UnpackRow) is read from
  // its packed copy: a row's buffer here.
  const GgufTensor* embd = model_->weights.token_embd;
  if (const cpu::PackedWeights* p = PackedFor(embd);
      p != nullptr &&
      (embd->type == DType::kQ8_0 || embd->type == DType::kQ4_0 || embd->type == DType::kQ4_1 ||
       embd->type == DType::kQ4_K || embd->type == DType::kQ5_K || embd->type == DType::kQ6_K)) {
    embd_row_.resize(static_cast<size_t>(*DTypeStorageBytes(embd->type, embd->shape[0])));
  }
  return absl::OkStatus();
}

const cpu::PackedWeights* CpuBackend::PackedFor(const GgufTensor* w) const {
  const auto it = packed_.find(w);
  return it == packed_.end() ? nullptr : &it->second;
}

KvLayout CpuBackend::KvLayoutFor(int64_t num_blocks) const {
  const ModelConfig& c = model_->config;
  return KvLayout{.num_blocks = num_blocks,
                  .num_layers = c.num_layers,
                  .block_size = options_.block_size,
                  .num_kv_heads = c.num_kv_heads,
                  .head_dim = c.head_dim,
                  .dtype = options_.kv_dtype};
}

const BackendSupport& CpuBackend::Support() {
  static const BackendSupport* support = new BackendSupport{
      .name = "cpu",
      .weight_types = {std::begin(kAllDTypes), std::end(kAllDTypes)},
      .kv_types = {DType::kF32, DType::kF16},
      .head_dims = {},
      .kv_on_device = false,
      .gemma_layers = true,
      .long_rope = true};
  return *support;
}

namespace {

cpu::MatMulParams LinearParams(const float* x, int64_t rows, const GgufTensor& w, float* y,
                               const cpu::PackedWeights* packed) {
  cpu::MatMulParams p;
  p.packed = packed;
  p.x = x;
  p.k = w.shape[0];
  p.n = w.shape.size() > 1 ? w.shape[1] : 1;
  p.x_stride = p.k;
  p.w = w.data;
  p.w_type = w.type;
  p.y = y;
  p.y_stride = p.n;
  p.m = rows;
  return p;
}

}  // namespace

absl::Status CpuBackend::Linear(const float* x, int64_t rows, const GgufTensor& w, float* y,
                               const cpu::MatMulExtras& extras) {
  const cpu::MatMulParams params = LinearParams(x, rows, w, y, PackedFor(&w));
  return cpu::MatMulShared(absl::MakeConstSpan(&params, 1),
                           cpu::KernelContext{.pool = pool_.get(), .isa = options_.isa}, extras);
}

absl::Status CpuBackend::LinearShared(
    const float* x, int64_t rows,
    std::initializer_list<std::pair<const GgufTensor*, float*>> products,
    const cpu::MatMulExtras& extras) {
  cpu::MatMulParams params[3];
  size_t n = 0;
  for (const auto& [wt, y] : products) params[n++] = LinearParams(x, rows, *wt, y, PackedFor(wt));
  return cpu::MatMulShared(absl::MakeConstSpan(params, n),
                           cpu::KernelContext{.pool = pool_.get(), .isa = options_.isa}, extras);
}

void CpuBackend::Norm(const float* in, const std::vector<float>& weight, float* out, int64_t rows,
                      float* residual) const {
  const ModelConfig& c = model_->config;
  const int64_t H = c.hidden_size;
  cpu::RmsNorm(cpu::RmsNormParams{.x = in, .x_stride = H, .residual = residual,
                                  .residual_stride = H, .weight = weight.data(), .out = out,
                                  .out_stride = H, .rows = rows, .dim = H,
                                  .eps = c.rms_norm_eps});
}

void CpuBackend::AddNorm(const std::vector<float>& weight, float* proj,
                         const std::vector<float>& proj_norm, float* x, float* out,
                         int64_t rows) const {
  if (proj != nullptr && !proj_norm.empty()) Norm(proj, proj_norm, proj, rows);
  Norm(proj != nullptr ? proj : x, weight, out, rows, proj != nullptr ? x : nullptr);
}

void CpuBackend::Rope(std::vector<float>& y, int64_t heads, int64_t l) {
  const ModelConfig& c = model_->config;
  const bool sliding = layers_[static_cast<size_t>(l)].sliding_rope;
  cpu::Rope(cpu::RopeParams{
      .x = y.data(), .token_stride = heads * c.head_dim, .head_stride = c.head_dim,
      .num_tokens = plan_.num_tokens, .num_heads = heads, .head_dim = c.head_dim,
      .rotary_dim = c.head_dim, .positions = plan_.token_pos.data(),
      .inv_freq = sliding ? inv_freq_sliding_.data() : inv_freq_.data(), .style = rope_style_,
      .cos_sin = sliding ? scratch_.rope_cos_sin_sliding.data() : scratch_.rope_cos_sin.data(),
      .scale = sliding ? 1.0f : rope_scale_});
}

void CpuBackend::HeadNorm(std::vector<float>& y, int64_t heads,
                          const std::vector<float>& weight) const {
  if (weight.empty()) return;
  const ModelConfig& c = model_->config;
  cpu::RmsNorm(cpu::RmsNormParams{.x = y.data(), .x_stride = c.head_dim,
                                  .weight = weight.data(), .out = y.data(),
                                  .out_stride = c.head_dim, .rows = plan_.num_tokens * heads,
                                  .dim = c.head_dim, .eps = c.rms_norm_eps});
}

void CpuBackend::CollectKvRows(int64_t l, const KvStorage& kv) {
  // Each sequence's positions 0 .. its last in this step; the step's own rows are written in
  // between, so asking for them early only saves a miss.
  const KvLayout& layout = kv.layout();
  std::vector<cpu::MemoryRange>& kv_rows = scratch_.kv_rows;
  kv_rows.clear();
  const int64_t row_bytes = layout.token_stride() * layout.element_bytes();
  const int64_t v_offset = layout.kv_stride() * layout.element_bytes();
  const int64_t max_blocks = plan_.max_blocks_per_seq;
  for (int64_t s = 0; s < plan_.num_sequences; ++s) {
    const int64_t positions = plan_.seq_lens[static_cast<size_t>(s)];
    for (int64_t b = 0; b * layout.block_size < positions; ++b) {
      const int64_t slots = std::min(layout.block_size, positions - b * layout.block_size);
      const std::byte* keys = kv.KeyBlock<std::byte>(
          plan_.block_tables[static_cast<size_t>(s * max_blocks + b)], l);
      kv_rows.push_back({keys, slots * row_bytes});
      kv_rows.push_back({keys + v_offset, slots * row_bytes});
    }
  }
  kv_rows_left_ = kv_rows;
}

namespace {

void Emit(const TensorDump& dump, const std::string& name, const float* data, int64_t rows,
          int64_t cols) {
  if (dump) dump(name, data, rows, cols);
}

// Every element of these is written before it is read.
std::vector<float>& Sized(std::vector<float>& v, int64_t n) {
  v.resize(static_cast<size_t>(n));
  return v;
}

void AddBias(std::vector<float>& y, const std::vector<float>& bias, int64_t rows) {
  if (bias.empty()) return;
  const int64_t n = static_cast<int64_t>(bias.size());
  for (int64_t r = 0; r < rows; ++r) cpu::Add(y.data() + r * n, bias.data(), y.data() + r * n, n);
}

}  // namespace

absl::Status CpuBackend::Plan(const StepBatch& batch, const KvStorage& kv) {
  RETURN_IF_ERROR(PlanStep(model_->config, batch, kv.layout(), &plan_));
  const int64_t T = plan_.num_tokens;
  // The KV rows layer l's attention reads go to the cache during the products just before it:
  // the first half during the previous layer's down projection, the rest during the layer's
  // Q/K/V product (all of it for layer 0). One product alone would have to carry the whole
  // stream and slow down.
  prefetch_kv_ = options_.prefetch_kv && T >= kPrefetchKvMinTokens && T <= kPrefetchKvMaxTokens;
  kv_rows_left_ = {};
  proj_pending_ = false;
  return absl::OkStatus();
}

absl::Status CpuBackend::Embed(const TensorDump& dump) {
  const ModelConfig& c = model_->config;
  const ModelWeights& w = model_->weights;
  const int64_t T = plan_.num_tokens, H = c.hidden_size, F = c.intermediate_size;
  const int64_t Dq = c.num_heads * c.head_dim, Dkv = c.num_kv_heads * c.head_dim;
  Scratch& sc = scratch_;
  // Embeddings: row id of token_embd ({H, V}) dequantized.
  std::vector<float>& x = Sized(sc.x, T * H);
  const int64_t embd_row_bytes = *DTypeStorageBytes(w.token_embd->type, H);
  // An embedding matrix that is also the (packed) output matrix has its packed copy resident
  // already. Its rows are read back from that copy where the packed format keeps the file's
  // bytes (Q8_0, Q4_0, Q4_1: bit-identical); otherwise from the file, whose pages a row read
  // brings back many at a time (fault-around and large page-cache folios map up to a megabyte per
  // read) and which would come to hold a second copy of the matrix over a long run, so they are
  // let go every kEmbedRowsPerDrop rows.
  constexpr int64_t kEmbedRowsPerDrop = 16;
  const cpu::PackedWeights* packed_embd = PackedFor(w.token_embd);
  const bool from_packed =
      packed_embd != nullptr && embd_row_.size() == static_cast<size_t>(embd_row_bytes);
  const bool drop = !from_packed && model_->file != nullptr && packed_embd != nullptr;
  for (int64_t t = 0; t < T; ++t) {
    const void* row =
        static_cast<const char*>(w.token_embd->data) + plan_.token_ids[t] * embd_row_bytes;
    if (from_packed) {
      RETURN_IF_ERROR(packed_embd->UnpackRow(plan_.token_ids[t], w.token_embd->type,
                                             embd_row_.data()));
      row = embd_row_.data();
    }
    DequantizeReference(w.token_embd->type, row, x.data() + t * H, H);
    if (drop && ((t + 1) % kEmbedRowsPerDrop == 0 || t + 1 == T)) {
      model_->file->DropPages(*w.token_embd);
    }
  }
  if (c.embedding_scale != 1.0f) {
    for (float& e : x) e *= c.embedding_scale;
  }
  // h holds each layer's attention output too ([T, Dq]) between the Q/K/V product, which reads
  // it as the normed input, and the MLP's norm, which writes it again.
  Sized(sc.h, T * std::max(H, Dq));
  Sized(sc.q, T * Dq);
  Sized(sc.k, T * Dkv);
  Sized(sc.v, T * Dkv);
  // The MLP's passes (Mlp); a step with a dump is one pass, so that every tensor is whole.
  pass_rows_ = dump ? std::max<int64_t>(T, 1) : mlp_rows_;
  const int64_t pass = std::min(T, pass_rows_);
  Sized(sc.gate, pass * F);
  Sized(sc.up, pass * F);
  Sized(sc.proj, pass * H);
  if (T > pass_rows_) Sized(sc.normed, pass * H);
  // The rotation angles depend only on the positions: once for Q and K of every layer.
  cpu::RopeCosSin(plan_.token_pos.data(), T, inv_freq_.data(), c.head_dim,
                  Sized(sc.rope_cos_sin, T * c.head_dim).data(), rope_scale_);
  if (!inv_freq_sliding_.empty()) {
    cpu::RopeCosSin(plan_.token_pos.data(), T, inv_freq_sliding_.data(), c.head_dim,
                    Sized(sc.rope_cos_sin_sliding, T * c.head_dim).data());
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::Attention(int64_t l, KvStorage* kv, const TensorDump& dump) {
  const ModelConfig& c = model_->config;
  const LayerWeights& lw = model_->weights.layers[static_cast<size_t>(l)];
  const SmallLayer& sl = layers_[static_cast<size_t>(l)];
  const KvLayout& layout = kv->layout();
  const int64_t T = plan_.num_tokens, H = c.hidden_size;
  const int64_t Dq = c.num_heads * c.head_dim, Dkv = c.num_kv_heads * c.head_dim;
  const std::string suffix = absl::StrCat("-", l);
  Scratch& sc = scratch_;

  if (prefetch_kv_ && l == 0) CollectKvRows(l, *kv);
  const bool add_proj = proj_pending_;
  // The pending product is the previous layer's FFN output.
  const std::vector<float>& proj_norm =
      l > 0 ? layers_[static_cast<size_t>(l - 1)].ffn_post_norm : sl.ffn_post_norm;
  auto attn_norm_rows = [&](int64_t begin, int64_t end) {
    AddNorm(sl.attn_norm, add_proj ? sc.proj.data() + begin * H : nullptr, proj_norm,
            sc.x.data() + begin * H, sc.h.data() + begin * H, end - begin);
  };
  RETURN_IF_ERROR(LinearShared(
      sc.h.data(), T, {{lw.attn_q, sc.q.data()}, {lw.attn_k, sc.k.data()}, {lw.attn_v, sc.v.data()}},
      {.prepare_rows = attn_norm_rows, .prefetch = kv_rows_left_}));
  kv_rows_left_ = {};
  if (proj_pending_) Emit(dump, absl::StrCat("l_out-", l - 1), sc.x.data(), T, H);
  Emit(dump, "attn_norm" + suffix, sc.h.data(), T, H);
  AddBias(sc.q, sl.q_bias, T);
  AddBias(sc.k, sl.k_bias, T);
  AddBias(sc.v, sl.v_bias, T);
  HeadNorm(sc.q, c.num_heads, sl.q_norm);
  HeadNorm(sc.k, c.num_kv_heads, sl.k_norm);
  Rope(sc.q, c.num_heads, l);
  Rope(sc.k, c.num_kv_heads, l);
  Emit(dump, "Qcur" + suffix, sc.q.data(), T, Dq);
  Emit(dump, "Kcur" + suffix, sc.k.data(), T, Dkv);
  Emit(dump, "Vcur" + suffix, sc.v.data(), T, Dkv);

  // This step's K/V go into the cache before attention reads it (rounded to half in an F16
  // cache).
  const cpu::KernelContext serial{.pool = nullptr, .isa = options_.isa};
  const int64_t max_blocks = plan_.max_blocks_per_seq;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t pos = plan_.token_pos[t];
    const int32_t block = plan_.block_tables[plan_.token_seq[t] * max_blocks + pos / layout.block_size];
    const int64_t slot = (pos % layout.block_size) * layout.token_stride();
    if (layout.dtype == DType::kF16) {
      uint16_t* kdst = kv->KeyBlock<uint16_t>(block, l) + slot;
      cpu::FloatsToHalves(sc.k.data() + t * Dkv, kdst, Dkv, serial);
      cpu::FloatsToHalves(sc.v.data() + t * Dkv, kdst + layout.kv_stride(), Dkv, serial);
    } else {
      float* kdst = kv->KeyBlock<float>(block, l) + slot;
      std::memcpy(kdst, sc.k.data() + t * Dkv, static_cast<size_t>(Dkv) * sizeof(float));
      std::memcpy(kdst + layout.kv_stride(), sc.v.data() + t * Dkv,
                  static_cast<size_t>(Dkv) * sizeof(float));
    }
  }
  // This layer of the cache is final for the step: a transfer may take it now.
  if (plan_.on_layer_done != nullptr && *plan_.on_layer_done) (*plan_.on_layer_done)(l);
  cpu::PagedAttentionParams ap;
  ap.q = sc.q.data();
  ap.q_token_stride = Dq;
  ap.out = sc.h.data();  // (Q/K/V have read it)
  ap.out_token_stride = Dq;
  ap.k_cache = kv->LayerKeys(l);
  ap.v_cache = kv->LayerValues(l);
  ap.kv_type = layout.dtype;
  ap.block_stride = layout.block_stride();
  ap.token_stride = layout.token_stride();
  ap.kv_head_stride = layout.kv_head_stride();
  ap.block_size = layout.block_size;
  ap.block_tables = plan_.block_tables.data();
  ap.max_blocks_per_seq = max_blocks;
  ap.token_seq = plan_.token_seq.data();
  ap.token_pos = plan_.token_pos.data();
  ap.num_tokens = T;
  ap.num_heads = c.num_heads;
  ap.num_kv_heads = c.num_kv_heads;
  ap.head_dim = c.head_dim;
  ap.window = sl.window;
  ap.scale = c.attention_scale;
  ap.softcap = c.attn_logit_softcap;
  RETURN_IF_ERROR(
      cpu::PagedAttention(ap, cpu::KernelContext{.pool = pool_.get(), .isa = options_.isa}));
  Emit(dump, "kqv_out" + suffix, sc.h.data(), T, Dq);
  return absl::OkStatus();
}

absl::Status CpuBackend::Mlp(int64_t l, const KvStorage& kv, const TensorDump& dump) {
  const ModelConfig& c = model_->config;
  const LayerWeights& lw = model_->weights.layers[static_cast<size_t>(l)];
  const SmallLayer& sl = layers_[static_cast<size_t>(l)];
  const int64_t T = plan_.num_tokens, H = c.hidden_size, F = c.intermediate_size;
  const std::string suffix = absl::StrCat("-", l);
  Scratch& sc = scratch_;

  const cpu::KernelContext serial{.pool = nullptr, .isa = options_.isa};
  const bool gelu = c.ffn_activation == ModelConfig::Activation::kGeluTanh;
  // Passes over rows [r0, r0 + rows) of the step (pass_rows_ at a time): the attention output's
  // projection into proj, its residual add into x and the norm, gate / up into the pass's
  // scratch, and the down projection into proj. The packed kernels take 16 weight rows at a time
  // over all of a pass's rows, so a pass of >= 64 rows keeps them as busy as the whole step did.
  // One pass (every decode step) leaves the MLP's residual add to the next norm
  // (proj_pending_), which does it row-parallel with the norm; with several, each pass adds its
  // own rows at its end, so proj holds one pass's rows. h holds attention's output for the rows
  // of later passes, so their norm goes to sc.normed.
  const bool one_pass = T <= pass_rows_;
  float* normed = one_pass ? sc.h.data() : sc.normed.data();
  const int64_t Dq = c.num_heads * c.head_dim;
  for (int64_t r0 = 0; r0 < T; r0 += pass_rows_) {
    const int64_t rows = std::min(pass_rows_, T - r0);
    float* x_rows = sc.x.data() + r0 * H;
    RETURN_IF_ERROR(Linear(sc.h.data() + r0 * Dq, rows, *lw.attn_output, sc.proj.data()));
    auto ffn_norm_rows = [&](int64_t begin, int64_t end) {
      AddNorm(sl.ffn_norm, sc.proj.data() + begin * H, sl.attn_post_norm, x_rows + begin * H,
              normed + begin * H, end - begin);
    };
    RETURN_IF_ERROR(LinearShared(normed, rows,
                                 {{lw.ffn_gate, sc.gate.data()}, {lw.ffn_up, sc.up.data()}},
                                 {.prepare_rows = ffn_norm_rows}));
    auto act_rows = [&](int64_t begin, int64_t end) {
      const cpu::SiluMulParams params{.gate = sc.gate.data() + begin * F,
                                      .up = sc.up.data() + begin * F,
                                      .out = sc.gate.data() + begin * F, .gate_stride = F,
                                      .up_stride = F, .out_stride = F, .rows = end - begin,
                                      .dim = F};
      if (gelu) {
        cpu::GeluTanhMul(params);
      } else {
        cpu::SiluMul(params, serial);
      }
    };
    cpu::MatMulExtras down_extras{.prepare_rows = act_rows};
    // (A step small enough to prefetch for is one pass: kPrefetchKvMaxTokens <= kMlpMinRows.)
    if (prefetch_kv_ && r0 == 0 && l + 1 < c.num_layers) {
      CollectKvRows(l + 1, kv);
      const size_t half = sc.kv_rows.size() / 2;
      down_extras.prefetch = kv_rows_left_.first(half);
      kv_rows_left_.remove_prefix(half);
    }
    RETURN_IF_ERROR(Linear(sc.gate.data(), rows, *lw.ffn_down, sc.proj.data(), down_extras));
    if (!one_pass) {
      // The same operations the next norm would do: proj normed with ffn_post_norm, then added.
      pool_->ParallelFor(rows, [&](int64_t begin, int64_t end) {
        float* p = sc.proj.data() + begin * H;
        if (!sl.ffn_post_norm.empty()) Norm(p, sl.ffn_post_norm, p, end - begin);
        cpu::Add(x_rows + begin * H, p, x_rows + begin * H, (end - begin) * H);
      });
    }
  }
  proj_pending_ = one_pass;
  // (A step with a dump is one pass: Embed.)
  if (one_pass) {
    Emit(dump, "ffn_inp" + suffix, sc.x.data(), T, H);
    Emit(dump, "ffn_norm" + suffix, sc.h.data(), T, H);
    Emit(dump, "ffn_out" + suffix, sc.proj.data(), T, H);
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::RunLayer(int64_t l, KvStorage* kv, const TensorDump& dump) {
  RETURN_IF_ERROR(Attention(l, kv, dump));
  RETURN_IF_ERROR(Mlp(l, *kv, dump));
  return absl::OkStatus();
}

absl::Status CpuBackend::Finish(StepOutput* out, const TensorDump& dump) {
  const ModelConfig& c = model_->config;
  const int64_t T = plan_.num_tokens, H = c.hidden_size;
  Scratch& sc = scratch_;
  // The last layer's residual add (the others ran in the next layer's first product).
  if (proj_pending_) {
    const std::vector<float>& post = layers_.back().ffn_post_norm;
    if (!post.empty()) Norm(sc.proj.data(), post, sc.proj.data(), T);
    cpu::Add(sc.x.data(), sc.proj.data(), sc.x.data(), T * H);
    Emit(dump, absl::StrCat("l_out-", c.num_layers - 1), sc.x.data(), T, H);
    proj_pending_ = false;
  }
  // Logits only for the rows that asked for them.
  const int64_t R = static_cast<int64_t>(plan_.logit_rows.size());
  out->vocab_size = c.vocab_size;
  // Resized, not refilled: the output product writes every element (and a caller that reuses
  // `out` keeps its capacity).
  out->logits.resize(static_cast<size_t>(R * c.vocab_size));
  if (R == 0) return absl::OkStatus();
  std::vector<float>& last = Sized(sc.last, R * H);
  for (int64_t r = 0; r < R; ++r) {
    std::memcpy(last.data() + r * H, sc.x.data() + plan_.logit_rows[static_cast<size_t>(r)] * H,
                static_cast<size_t>(H) * sizeof(float));
  }
  Norm(last.data(), output_norm_, last.data(), R);
  Emit(dump, "result_norm", last.data(), R, H);
  RETURN_IF_ERROR(Linear(last.data(), R, *model_->weights.output, out->logits.data()));
  if (c.final_logit_softcap > 0.0f) {
    cpu::SoftCap(out->logits.data(), R * c.vocab_size, c.final_logit_softcap);
  }
  Emit(dump, "result_output", out->logits.data(), R, c.vocab_size);
  return absl::OkStatus();
}

}  // namespace tandem
