#include "engine/runtime/cpu_forward.h"

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

CpuForward::CpuForward(const LoadedModel* model, const Options& options)
    : model_(model), options_(options) {}

absl::StatusOr<std::unique_ptr<CpuForward>> CpuForward::Create(const LoadedModel* model,
                                                               const Options& options) {
  if (model == nullptr || model->weights.token_embd == nullptr) {
    return absl::InvalidArgumentError("CpuForward needs a loaded model");
  }
  if (options.block_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("block_size must be positive, got ",
                                                   options.block_size));
  }
  auto forward = std::unique_ptr<CpuForward>(new CpuForward(model, options));
  RETURN_IF_ERROR(forward->Init());
  return forward;
}

absl::Status CpuForward::Init() {
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
  } else if (c.rope_scaling.type == RopeScaling::Type::kLlama3) {
    ApplyLlama3Scaling(c.rope_scaling, &inv_freq_);
  } else if (c.rope_scaling.type == RopeScaling::Type::kLinear) {
    for (float& f : inv_freq_) f /= c.rope_scaling.factor;
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
  }
  if (options_.pack_weights) RETURN_IF_ERROR(PackWeights());
  return absl::OkStatus();
}

absl::Status CpuForward::PackWeights() {
  const cpu::Isa isa = options_.isa.value_or(cpu::ActiveIsa());
  std::vector<const GgufTensor*> matrices;
  for (const LayerWeights& lw : model_->weights.layers) {
    matrices.insert(matrices.end(), {lw.attn_q, lw.attn_k, lw.attn_v, lw.attn_output, lw.ffn_gate,
                                     lw.ffn_up, lw.ffn_down});
  }
  matrices.push_back(model_->weights.output);
  for (const GgufTensor* t : matrices) {
    if (t == nullptr || t->shape.size() != 2 || packed_.contains(t)) continue;
    const std::optional<cpu::PackedFormat> format = cpu::PackedWeights::FormatFor(t->type);
    if (!format.has_value() || !cpu::PackedKernelIsNative(*format, isa)) {
      continue;
    }
    absl::StatusOr<cpu::PackedWeights> packed =
        cpu::PackedWeights::Pack(t->data, t->type, t->shape[1], t->shape[0]);
    // A matrix that cannot be packed (a Q4_0 scale past f16's range), or whose copy cannot be
    // allocated, runs on the row kernels from the mapped file.
    if (packed.status().code() == absl::StatusCode::kOutOfRange ||
        packed.status().code() == absl::StatusCode::kResourceExhausted) {
      continue;
    }
    if (!packed.ok()) {
      return absl::Status(packed.status().code(),
                          absl::StrCat(t->name, ": ", packed.status().message()));
    }
    packed_.emplace(t, *std::move(packed));
    // The packed copy replaces the file's bytes in memory; an embedding matrix tied to the
    // output reads a few rows a step, which come back from the page cache.
    if (model_->file != nullptr) model_->file->DropPages(*t);
  }
  return absl::OkStatus();
}

const cpu::PackedWeights* CpuForward::PackedFor(const GgufTensor* w) const {
  const auto it = packed_.find(w);
  return it == packed_.end() ? nullptr : &it->second;
}

KvLayout CpuForward::KvLayoutFor(int64_t num_blocks) const {
  const ModelConfig& c = model_->config;
  return KvLayout{.num_blocks = num_blocks,
                  .num_layers = c.num_layers,
                  .block_size = options_.block_size,
                  .num_kv_heads = c.num_kv_heads,
                  .head_dim = c.head_dim,
                  .dtype = options_.kv_dtype};
}

absl::Status CpuForward::Validate(const StepBatch& batch, const KvStorage& kv) const {
  const ModelConfig& c = model_->config;
  const KvLayout& l = kv.layout();
  if (l.num_layers != c.num_layers || l.num_kv_heads != c.num_kv_heads || l.head_dim != c.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV layout (layers=", l.num_layers, " kv_heads=", l.num_kv_heads, " head_dim=", l.head_dim,
        ") does not match the model (", c.num_layers, ", ", c.num_kv_heads, ", ", c.head_dim, ")"));
  }
  if (batch.sequences.empty()) return absl::InvalidArgumentError("empty batch");
  for (size_t i = 0; i < batch.sequences.size(); ++i) {
    const StepSequence& s = batch.sequences[i];
    if (s.tokens.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", i, " has no tokens"));
    }
    for (int32_t t : s.tokens) {
      if (t < 0 || t >= c.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("sequence ", i, ": token id ", t,
                                                       " is outside the vocabulary [0, ",
                                                       c.vocab_size, ")"));
      }
    }
    const int64_t end = s.start_position + static_cast<int64_t>(s.tokens.size());
    if (s.start_position < 0 || end > c.max_context) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", i, ": positions ",
                                                     s.start_position, "..", end - 1,
                                                     " exceed the context length ", c.max_context));
    }
    const int64_t needed = (end + l.block_size - 1) / l.block_size;
    if (static_cast<int64_t>(s.block_table.size()) < needed) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", i, ": ", s.block_table.size(),
                                                     " KV blocks cannot hold ", end, " positions"));
    }
    for (int64_t b = 0; b < needed; ++b) {
      const int32_t block = s.block_table[static_cast<size_t>(b)];
      if (block < 0 || block >= l.num_blocks) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", i, ": KV block id ", block, " is outside the pool"));
      }
    }
  }
  return absl::OkStatus();
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

absl::Status CpuForward::Linear(const float* x, int64_t rows, const GgufTensor& w, float* y,
                               const cpu::MatMulExtras& extras) {
  const cpu::MatMulParams params = LinearParams(x, rows, w, y, PackedFor(&w));
  return cpu::MatMulShared(absl::MakeConstSpan(&params, 1),
                           cpu::KernelContext{.pool = pool_.get(), .isa = options_.isa}, extras);
}

absl::Status CpuForward::Step(const StepBatch& batch, KvStorage* kv, StepOutput* out,
                              const TensorDump& dump) {
  RETURN_IF_ERROR(Validate(batch, *kv));
  const ModelConfig& c = model_->config;
  const ModelWeights& w = model_->weights;
  const KvLayout& layout = kv->layout();
  const int64_t H = c.hidden_size, F = c.intermediate_size;
  const int64_t Dq = c.num_heads * c.head_dim, Dkv = c.num_kv_heads * c.head_dim;

  // Flatten the batch: token t belongs to sequence token_seq[t] at position token_pos[t].
  const int64_t num_seqs = static_cast<int64_t>(batch.sequences.size());
  int64_t max_blocks = 0;
  // The step's buffers live in scratch_ and keep their capacity from step to step: a step no
  // larger than an earlier one allocates none of them.
  Scratch& sc = scratch_;
  std::vector<int32_t>&token_ids = sc.token_ids, &token_seq = sc.token_seq,
                     &token_pos = sc.token_pos;
  std::vector<int64_t>& logit_rows = sc.logit_rows;  // token rows whose logits are returned
  token_ids.clear();
  token_seq.clear();
  token_pos.clear();
  logit_rows.clear();
  for (int64_t s = 0; s < num_seqs; ++s) {
    const StepSequence& seq = batch.sequences[static_cast<size_t>(s)];
    max_blocks = std::max<int64_t>(max_blocks, static_cast<int64_t>(seq.block_table.size()));
    for (size_t i = 0; i < seq.tokens.size(); ++i) {
      token_ids.push_back(seq.tokens[i]);
      token_seq.push_back(static_cast<int32_t>(s));
      token_pos.push_back(static_cast<int32_t>(seq.start_position + static_cast<int64_t>(i)));
    }
    if (seq.compute_logits) logit_rows.push_back(static_cast<int64_t>(token_ids.size()) - 1);
  }
  const int64_t T = static_cast<int64_t>(token_ids.size());
  std::vector<int32_t>& tables = sc.tables;
  tables.assign(static_cast<size_t>(num_seqs * max_blocks), 0);
  for (int64_t s = 0; s < num_seqs; ++s) {
    const auto& table = batch.sequences[static_cast<size_t>(s)].block_table;
    std::copy(table.begin(), table.end(), tables.begin() + s * max_blocks);
  }

  // Products of the same activations (Q/K/V, gate/up) in one kernel call: one quantization of x
  // and one pass over the thread pool. The elementwise step that makes the activations (norm,
  // SwiGLU) runs inside the call, split over the pool (MatMulExtras::prepare_rows).
  auto linear_shared = [&](const float* in, int64_t rows,
                           std::initializer_list<std::pair<const GgufTensor*, float*>> products,
                           const cpu::MatMulExtras& extras) {
    cpu::MatMulParams params[3];
    size_t n = 0;
    for (const auto& [wt, y] : products) {
      params[n++] = LinearParams(in, rows, *wt, y, PackedFor(wt));
    }
    return cpu::MatMulShared(absl::MakeConstSpan(params, n),
                             cpu::KernelContext{.pool = pool_.get(), .isa = options_.isa},
                             extras);
  };
  // The KV rows layer l's attention reads (each sequence's positions 0 .. its last in this step;
  // the step's own rows are written in between, so asking for them early only saves a miss) go
  // to the cache during the products just before it: the first half during the previous layer's
  // down projection, the rest during the layer's Q/K/V product (all of it for layer 0). One
  // product alone would have to carry the whole stream and slow down.
  const bool prefetch_kv = options_.prefetch_kv && T >= kPrefetchKvMinTokens &&
                           T <= kPrefetchKvMaxTokens;
  std::vector<cpu::MemoryRange>& kv_rows = sc.kv_rows;
  absl::Span<const cpu::MemoryRange> kv_rows_left;  // of kv_rows, for the next Q/K/V product
  auto collect_kv_rows = [&](int64_t l) {
    kv_rows.clear();
    const int64_t row_bytes = layout.token_stride() * layout.element_bytes();
    const int64_t v_offset = layout.kv_stride() * layout.element_bytes();
    for (const StepSequence& seq : batch.sequences) {
      const int64_t positions = seq.start_position + static_cast<int64_t>(seq.tokens.size());
      for (int64_t b = 0; b * layout.block_size < positions; ++b) {
        const int64_t slots = std::min(layout.block_size, positions - b * layout.block_size);
        const std::byte* keys = kv->KeyBlock<std::byte>(seq.block_table[static_cast<size_t>(b)], l);
        kv_rows.push_back({keys, slots * row_bytes});
        kv_rows.push_back({keys + v_offset, slots * row_bytes});
      }
    }
    kv_rows_left = kv_rows;
  };
  auto emit = [&](const std::string& name, const float* data, int64_t rows, int64_t cols) {
    if (dump) dump(name, data, rows, cols);
  };

  // Embeddings: row id of token_embd ({H, V}) dequantized.
  // Every element of these is written before it is read.
  auto sized = [](std::vector<float>& v, int64_t n) -> std::vector<float>& {
    v.resize(static_cast<size_t>(n));
    return v;
  };
  std::vector<float>& x = sized(sc.x, T * H);
  const int64_t embd_row_bytes = *DTypeStorageBytes(w.token_embd->type, H);
  for (int64_t t = 0; t < T; ++t) {
    DequantizeReference(w.token_embd->type,
                        static_cast<const char*>(w.token_embd->data) + token_ids[t] * embd_row_bytes,
                        x.data() + t * H, H);
  }

  std::vector<float>&h = sized(sc.h, T * H), &q = sized(sc.q, T * Dq), &k = sized(sc.k, T * Dkv),
                     &v = sized(sc.v, T * Dkv), &attn = sized(sc.attn, T * Dq),
                     &gate = sized(sc.gate, T * F), &up = sized(sc.up, T * F),
                     &proj = sized(sc.proj, T * H);
  auto add_bias = [](std::vector<float>& y, const std::vector<float>& bias, int64_t rows) {
    if (bias.empty()) return;
    for (int64_t r = 0; r < rows; ++r) cpu::Add(y.data() + r * static_cast<int64_t>(bias.size()),
                                                bias.data(),
                                                y.data() + r * static_cast<int64_t>(bias.size()),
                                                static_cast<int64_t>(bias.size()));
  };
  // out = norm(in) over `rows` rows; with `residual`, residual += in first and out = norm of that.
  auto norm = [&](const float* in, const std::vector<float>& weight, float* o, int64_t rows,
                  float* residual = nullptr) {
    cpu::RmsNorm(cpu::RmsNormParams{.x = in, .x_stride = H, .residual = residual,
                                    .residual_stride = H, .weight = weight.data(), .out = o,
                                    .out_stride = H, .rows = rows, .dim = H,
                                    .eps = c.rms_norm_eps});
  };
  // Rows [begin, end) of h = norm(x), after x += proj when `add_proj` (the residual add of the
  // product before).
  auto norm_rows = [&](const std::vector<float>& weight, bool add_proj, int64_t begin,
                       int64_t end) {
    float* x_rows = x.data() + begin * H;
    norm(add_proj ? proj.data() + begin * H : x_rows, weight, h.data() + begin * H, end - begin,
         add_proj ? x_rows : nullptr);
  };
  const cpu::KernelContext serial{.pool = nullptr, .isa = options_.isa};
  // The rotation angles depend only on the positions: once for Q and K of every layer.
  std::vector<float>& rope_cos_sin = sized(sc.rope_cos_sin, T * c.head_dim);
  cpu::RopeCosSin(token_pos.data(), T, inv_freq_.data(), c.head_dim, rope_cos_sin.data());
  auto rope = [&](std::vector<float>& y, int64_t heads) {
    cpu::Rope(cpu::RopeParams{.x = y.data(), .token_stride = heads * c.head_dim,
                              .head_stride = c.head_dim, .num_tokens = T, .num_heads = heads,
                              .head_dim = c.head_dim, .rotary_dim = c.head_dim,
                              .positions = token_pos.data(), .inv_freq = inv_freq_.data(),
                              .style = rope_style_, .cos_sin = rope_cos_sin.data()});
  };

  // proj holds the last product's output until its residual add into x, which runs inside the
  // next product's prepare_rows (fused with the norm that reads x).
  bool proj_pending = false;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& lw = w.layers[static_cast<size_t>(l)];
    const SmallLayer& sl = layers_[static_cast<size_t>(l)];
    const std::string suffix = absl::StrCat("-", l);

    if (prefetch_kv && l == 0) collect_kv_rows(l);
    auto attn_norm_rows = [&](int64_t begin, int64_t end) {
      norm_rows(sl.attn_norm, proj_pending, begin, end);
    };
    RETURN_IF_ERROR(linear_shared(
        h.data(), T, {{lw.attn_q, q.data()}, {lw.attn_k, k.data()}, {lw.attn_v, v.data()}},
        {.prepare_rows = attn_norm_rows, .prefetch = kv_rows_left}));
    kv_rows_left = {};
    if (proj_pending) emit(absl::StrCat("l_out-", l - 1), x.data(), T, H);
    emit("attn_norm" + suffix, h.data(), T, H);
    add_bias(q, sl.q_bias, T);
    add_bias(k, sl.k_bias, T);
    add_bias(v, sl.v_bias, T);
    rope(q, c.num_heads);
    rope(k, c.num_kv_heads);
    emit("Qcur" + suffix, q.data(), T, Dq);
    emit("Kcur" + suffix, k.data(), T, Dkv);
    emit("Vcur" + suffix, v.data(), T, Dkv);

    // This step's K/V go into the cache before attention reads it (rounded to half in an F16
    // cache).
    for (int64_t t = 0; t < T; ++t) {
      const int64_t pos = token_pos[t];
      const int32_t block = tables[token_seq[t] * max_blocks + pos / layout.block_size];
      const int64_t slot = (pos % layout.block_size) * layout.token_stride();
      if (layout.dtype == DType::kF16) {
        uint16_t* kdst = kv->KeyBlock<uint16_t>(block, l) + slot;
        cpu::FloatsToHalves(k.data() + t * Dkv, kdst, Dkv, serial);
        cpu::FloatsToHalves(v.data() + t * Dkv, kdst + layout.kv_stride(), Dkv, serial);
      } else {
        float* kdst = kv->KeyBlock<float>(block, l) + slot;
        std::memcpy(kdst, k.data() + t * Dkv, static_cast<size_t>(Dkv) * sizeof(float));
        std::memcpy(kdst + layout.kv_stride(), v.data() + t * Dkv,
                    static_cast<size_t>(Dkv) * sizeof(float));
      }
    }
    // This layer of the cache is final for the step: a transfer may take it now.
    if (batch.on_layer_done) batch.on_layer_done(l);
    cpu::PagedAttentionParams ap;
    ap.q = q.data();
    ap.q_token_stride = Dq;
    ap.out = attn.data();
    ap.out_token_stride = Dq;
    ap.k_cache = kv->LayerKeys(l);
    ap.v_cache = kv->LayerValues(l);
    ap.kv_type = layout.dtype;
    ap.block_stride = layout.block_stride();
    ap.token_stride = layout.token_stride();
    ap.kv_head_stride = layout.kv_head_stride();
    ap.block_size = layout.block_size;
    ap.block_tables = tables.data();
    ap.max_blocks_per_seq = max_blocks;
    ap.token_seq = token_seq.data();
    ap.token_pos = token_pos.data();
    ap.num_tokens = T;
    ap.num_heads = c.num_heads;
    ap.num_kv_heads = c.num_kv_heads;
    ap.head_dim = c.head_dim;
    RETURN_IF_ERROR(
        cpu::PagedAttention(ap, cpu::KernelContext{.pool = pool_.get(), .isa = options_.isa}));
    emit("kqv_out" + suffix, attn.data(), T, Dq);

    RETURN_IF_ERROR(Linear(attn.data(), T, *lw.attn_output, proj.data()));

    auto ffn_norm_rows = [&](int64_t begin, int64_t end) {
      norm_rows(sl.ffn_norm, /*add_proj=*/true, begin, end);
    };
    RETURN_IF_ERROR(linear_shared(h.data(), T,
                                  {{lw.ffn_gate, gate.data()}, {lw.ffn_up, up.data()}},
                                  {.prepare_rows = ffn_norm_rows}));
    emit("ffn_inp" + suffix, x.data(), T, H);
    emit("ffn_norm" + suffix, h.data(), T, H);
    auto silu_rows = [&](int64_t begin, int64_t end) {
      cpu::SiluMul(cpu::SiluMulParams{.gate = gate.data() + begin * F, .up = up.data() + begin * F,
                                      .out = gate.data() + begin * F, .gate_stride = F,
                                      .up_stride = F, .out_stride = F, .rows = end - begin,
                                      .dim = F},
                   serial);
    };
    cpu::MatMulExtras down_extras{.prepare_rows = silu_rows};
    if (prefetch_kv && l + 1 < c.num_layers) {
      collect_kv_rows(l + 1);
      down_extras.prefetch = kv_rows_left.first(kv_rows.size() / 2);
      kv_rows_left.remove_prefix(kv_rows.size() / 2);
    }
    RETURN_IF_ERROR(Linear(gate.data(), T, *lw.ffn_down, proj.data(), down_extras));
    emit("ffn_out" + suffix, proj.data(), T, H);
    proj_pending = true;
  }
  // The last layer's residual add (the others ran in the next layer's first product).
  if (proj_pending) {
    cpu::Add(x.data(), proj.data(), x.data(), T * H);
    emit(absl::StrCat("l_out-", c.num_layers - 1), x.data(), T, H);
  }

  // Logits only for the rows that asked for them.
  const int64_t R = static_cast<int64_t>(logit_rows.size());
  out->vocab_size = c.vocab_size;
  // Resized, not refilled: the output product writes every element (and a caller that reuses
  // `out` keeps its capacity).
  out->logits.resize(static_cast<size_t>(R * c.vocab_size));
  if (R == 0) return absl::OkStatus();
  std::vector<float>& last = sized(sc.last, R * H);
  for (int64_t r = 0; r < R; ++r) {
    std::memcpy(last.data() + r * H, x.data() + logit_rows[static_cast<size_t>(r)] * H,
                static_cast<size_t>(H) * sizeof(float));
  }
  norm(last.data(), output_norm_, last.data(), R);
  emit("result_norm", last.data(), R, H);
  RETURN_IF_ERROR(Linear(last.data(), R, *w.output, out->logits.data()));
  emit("result_output", out->logits.data(), R, c.vocab_size);
  return absl::OkStatus();
}

}  // namespace tandem
