#include "engine/runtime/backend.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace tandem {
namespace {

bool Contains(const std::vector<DType>& types, DType t) {
  return std::find(types.begin(), types.end(), t) != types.end();
}

std::string Names(const std::vector<DType>& types) {
  return absl::StrJoin(types, ", ", [](std::string* out, DType t) {
    absl::StrAppend(out, DTypeName(t));
  });
}

}  // namespace

absl::Status CheckSupport(const BackendSupport& support, const LoadedModel& model,
                          DType kv_type) {
  const ModelConfig& c = model.config;
  if (!support.head_dims.empty() &&
      std::find(support.head_dims.begin(), support.head_dims.end(), c.head_dim) ==
          support.head_dims.end()) {
    return absl::UnimplementedError(absl::StrCat("the ", support.name,
                                                 " backend has no attention for head dimension ",
                                                 c.head_dim));
  }
  if (!Contains(support.kv_types, kv_type)) {
    return absl::UnimplementedError(absl::StrCat("the ", support.name, " backend keeps no ",
                                                 DTypeName(kv_type), " KV cache (it keeps ",
                                                 Names(support.kv_types), ")"));
  }
  if (!support.gemma_layers) {
    const char* missing = nullptr;
    if (c.embedding_scale != 1.0f) missing = "scaled token embeddings";
    if (c.ffn_activation != ModelConfig::Activation::kSilu) missing = "a GELU-gated FFN";
    if (c.post_norms) missing = "post-attention/post-FFN norms";
    if (c.attention_scale != 0.0f) missing = "an attention scale other than 1/sqrt(head_dim)";
    if (c.attn_logit_softcap > 0.0f) missing = "attention logit soft-capping";
    if (c.final_logit_softcap > 0.0f) missing = "final logit soft-capping";
    if (!c.sliding_layers.empty()) missing = "per-layer sliding windows";
    if (c.rope_theta_sliding > 0.0f) missing = "a RoPE base per layer";
    if (missing != nullptr) {
      return absl::UnimplementedError(absl::StrCat("the ", support.name, " backend cannot run ",
                                                   c.architecture, ": it lacks ", missing));
    }
  }
  if (!support.long_rope && c.rope_scaling.type == RopeScaling::Type::kLongRope) {
    return absl::UnimplementedError(absl::StrCat("the ", support.name, " backend cannot run ",
                                                 c.architecture, ": it lacks LongRoPE"));
  }
  auto check = [&](const GgufTensor* t) -> absl::Status {
    if (t == nullptr || Contains(support.weight_types, t->type)) return absl::OkStatus();
    return absl::UnimplementedError(absl::StrCat("the ", support.name, " backend cannot multiply ",
                                                 t->name, " of type ", DTypeName(t->type),
                                                 " (it takes ", Names(support.weight_types), ")"));
  };
  for (const LayerWeights& lw : model.weights.layers) {
    for (const GgufTensor* t : {lw.attn_q, lw.attn_k, lw.attn_v, lw.attn_output, lw.ffn_gate,
                                lw.ffn_up, lw.ffn_down}) {
      RETURN_IF_ERROR(check(t));
    }
  }
  return check(model.weights.output);
}

absl::Status PlanStep(const ModelConfig& c, const StepBatch& batch, const KvLayout& l,
                      StepPlan* plan) {
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

  // Flatten: token t belongs to sequence token_seq[t] at position token_pos[t]. The vectors keep
  // their capacity: a step no larger than an earlier one allocates nothing.
  const int64_t num_seqs = static_cast<int64_t>(batch.sequences.size());
  plan->num_sequences = num_seqs;
  plan->token_ids.clear();
  plan->token_seq.clear();
  plan->token_pos.clear();
  plan->logit_rows.clear();
  plan->seq_lens.clear();
  int64_t max_blocks = 0;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const StepSequence& seq = batch.sequences[static_cast<size_t>(s)];
    max_blocks = std::max<int64_t>(max_blocks, static_cast<int64_t>(seq.block_table.size()));
    for (size_t i = 0; i < seq.tokens.size(); ++i) {
      plan->token_ids.push_back(seq.tokens[i]);
      plan->token_seq.push_back(static_cast<int32_t>(s));
      plan->token_pos.push_back(
          static_cast<int32_t>(seq.start_position + static_cast<int64_t>(i)));
    }
    plan->seq_lens.push_back(
        static_cast<int32_t>(seq.start_position + static_cast<int64_t>(seq.tokens.size())));
    const auto end = static_cast<int64_t>(plan->token_ids.size());
    if (seq.all_logits) {
      for (int64_t row = end - static_cast<int64_t>(seq.tokens.size()); row < end; ++row) {
        plan->logit_rows.push_back(row);
      }
    } else if (seq.compute_logits) {
      plan->logit_rows.push_back(end - 1);
    }
  }
  plan->num_tokens = static_cast<int64_t>(plan->token_ids.size());
  plan->max_blocks_per_seq = max_blocks;
  plan->block_tables.assign(static_cast<size_t>(num_seqs * max_blocks), 0);
  for (int64_t s = 0; s < num_seqs; ++s) {
    const auto& table = batch.sequences[static_cast<size_t>(s)].block_table;
    std::copy(table.begin(), table.end(), plan->block_tables.begin() + s * max_blocks);
  }
  plan->on_layer_done = &batch.on_layer_done;
  return absl::OkStatus();
}

absl::Status Backend::Step(const StepBatch& batch, KvStorage* kv, StepOutput* out,
                           const TensorDump& dump) {
  RETURN_IF_ERROR(Plan(batch, *kv));
  RETURN_IF_ERROR(Embed(dump));
  for (int64_t l = 0; l < config().num_layers; ++l) RETURN_IF_ERROR(RunLayer(l, kv, dump));
  return Finish(out, dump);
}

}  // namespace tandem
