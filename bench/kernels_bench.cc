// CPU kernel microbenchmarks: MatMul on SmolLM2-135M-shaped weights and paged-attention decode,
// for every ISA the host runs. Single-threaded unless the name says "threads", so the figures
// compare instruction sets rather than core counts.
//
//   MatMul/<isa>/<dtype>/M<m>/K<k>/N<n>   bytes_per_second = weight bytes streamed; FLOPS = 2·M·N·K
//   MatMulPacked/...                      the same weights repacked (packed_weights.h)
//   PagedAttentionPrompt/<isa>/F16/chunk<n>/ctx<c>/{whole,by_token}
//                                         a prompt chunk of n tokens ending at position c, one
//                                         call (tiles of its tokens) or one call per token
//   PagedAttentionDecode/<isa>/<kv>/ctx<c>/seqs<s>
//                                         s sequences × 1 token, 9 heads / 3 KV heads × 64, an
//                                         F32 or F16 cache (4 sequences stay in cache memory,
//                                         32 at ctx 512 do not: 50 MiB in F32, as a decode step
//                                         of a batch reads); bytes_per_second = K and V bytes read
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "benchmark/benchmark.h"
#include "engine/core/dtype.h"
#include "engine/cpu/cpu_features.h"
#include "engine/cpu/matmul.h"
#include "engine/cpu/packed_weights.h"
#include "engine/cpu/paged_attention.h"
#include "engine/cpu/thread_pool.h"

namespace tandem::cpu {
namespace {

std::vector<uint8_t> RandomBlocks(DType type, int64_t n, int64_t k, std::mt19937& rng) {
  std::vector<uint8_t> w(static_cast<size_t>(*DTypeStorageBytes(type, n * k)));
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : w) b = static_cast<uint8_t>(byte(rng));
  const int64_t block_bytes = DTypeBlockBytes(type);
  const uint16_t scale = FloatToHalf(0.01f);
  // Sane f16 scales (and Q4_1 / Q5_1 / K-quant mins); Q6_K keeps its d last.
  const bool with_min = type == DType::kQ4_1 || type == DType::kQ5_1 || type == DType::kQ4_K ||
                        type == DType::kQ5_K;
  const int64_t d_offset = type == DType::kQ6_K ? block_bytes - 2 : 0;
  for (size_t off = 0; off < w.size(); off += block_bytes) {
    __builtin_memcpy(&w[off + d_offset], &scale, 2);
    if (with_min) __builtin_memcpy(&w[off + 2], &scale, 2);
  }
  return w;
}

void BM_MatMul(benchmark::State& state, Isa isa, DType type, int64_t m, int64_t k, int64_t n,
               int threads, bool packed) {
  std::mt19937 rng(1);
  const std::vector<uint8_t> w = RandomBlocks(type, n, k, rng);
  absl::StatusOr<PackedWeights> packed_w = PackedWeights::Pack(w.data(), type, n, k);
  if (packed && !packed_w.ok()) {
    state.SkipWithError("Pack failed");
    return;
  }
  std::vector<float> x(static_cast<size_t>(m * k));
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& v : x) v = dist(rng);
  std::vector<float> y(static_cast<size_t>(m * n));
  ThreadPool pool({.num_threads = threads});
  const MatMulParams p{.x = x.data(),
                       .x_stride = k,
                       .w = w.data(),
                       .w_type = type,
                       .y = y.data(),
                       .y_stride = n,
                       .m = m,
                       .n = n,
                       .k = k,
                       .packed = packed ? &*packed_w : nullptr};
  const KernelContext ctx{.pool = threads > 1 ? &pool : nullptr, .isa = isa};
  for (auto _ : state) {
    if (!MatMul(p, ctx).ok()) {
      state.SkipWithError("MatMul failed");
      break;
    }
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(w.size()));
  state.counters["FLOPS"] = benchmark::Counter(
      2.0 * static_cast<double>(m * n * k) * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate);
}

// SmolLM2-135M's attention shape (9 heads / 3 KV heads × 64, 16-token blocks) over `num_seqs`
// sequences of `context` cached positions, their blocks in order, random K/V held only in
// kv_type; one query token per (sequence, position) of `tokens`, all of its elements `q_value`
// or, when that is NaN, random.
struct AttentionCase {
  static constexpr int64_t kHeads = 9, kKvHeads = 3, kHeadDim = 64, kBlockSize = 16;
  static constexpr int64_t kTokenStride = kKvHeads * kHeadDim;
  std::vector<float> k_f32, v_f32, q, out;
  std::vector<uint16_t> k_f16, v_f16;
  std::vector<int32_t> tables, seq, pos;
  PagedAttentionParams params;

  AttentionCase(DType kv_type, int64_t num_seqs, int64_t context,
                const std::vector<std::pair<int32_t, int32_t>>& tokens, float q_value,
                uint32_t seed) {
    const int64_t blocks_per_seq = (context + kBlockSize - 1) / kBlockSize;
    const size_t elements = static_cast<size_t>(num_seqs * blocks_per_seq * kBlockSize *
                                                kTokenStride);
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    const bool f16 = kv_type == DType::kF16;
    for (std::vector<float>* cache : {&k_f32, &v_f32}) {
      cache->resize(elements);
      for (float& x : *cache) x = dist(rng);
    }
    if (f16) {  // only the cache being read stays resident
      for (auto [from, to] : {std::pair{&k_f32, &k_f16}, std::pair{&v_f32, &v_f16}}) {
        to->resize(elements);
        for (size_t i = 0; i < elements; ++i) (*to)[i] = FloatToHalf((*from)[i]);
        *from = {};
      }
    }
    tables.resize(static_cast<size_t>(num_seqs * blocks_per_seq));
    for (size_t i = 0; i < tables.size(); ++i) tables[i] = static_cast<int32_t>(i);
    for (auto [s, p] : tokens) {
      seq.push_back(s);
      pos.push_back(p);
    }
    q.resize(tokens.size() * kHeads * kHeadDim);
    for (float& x : q) x = std::isnan(q_value) ? dist(rng) : q_value;
    out.resize(q.size());
    params = PagedAttentionParams{
        .q = q.data(),
        .q_token_stride = kHeads * kHeadDim,
        .out = out.data(),
        .out_token_stride = kHeads * kHeadDim,
        .k_cache = f16 ? static_cast<const void*>(k_f16.data()) : k_f32.data(),
        .v_cache = f16 ? static_cast<const void*>(v_f16.data()) : v_f32.data(),
        .kv_type = kv_type,
        .block_stride = kBlockSize * kTokenStride,
        .token_stride = kTokenStride,
        .kv_head_stride = kHeadDim,
        .block_size = kBlockSize,
        .block_tables = tables.data(),
        .max_blocks_per_seq = blocks_per_seq,
        .token_seq = seq.data(),
        .token_pos = pos.data(),
        .num_tokens = static_cast<int64_t>(tokens.size()),
        .num_heads = kHeads,
        .num_kv_heads = kKvHeads,
        .head_dim = kHeadDim};
  }
};

void BM_PagedAttentionDecode(benchmark::State& state, Isa isa, DType kv_type, int64_t context,
                             int64_t num_seqs) {
  std::vector<std::pair<int32_t, int32_t>> tokens;
  for (int32_t s = 0; s < num_seqs; ++s) tokens.push_back({s, static_cast<int32_t>(context - 1)});
  AttentionCase c(kv_type, num_seqs, context, tokens, 0.1f, 2);
  for (auto _ : state) {
    if (!PagedAttention(c.params, {.isa = isa}).ok()) {
      state.SkipWithError("PagedAttention failed");
      break;
    }
    benchmark::DoNotOptimize(c.out.data());
  }
  state.SetBytesProcessed(state.iterations() * 2 * num_seqs * context *
                          AttentionCase::kTokenStride * (kv_type == DType::kF16 ? 2 : 4));
}

// A prompt chunk of `chunk` tokens of one sequence at positions context - chunk .. context - 1
// over an F16 cache: `whole` as one step sees it (the chunk's tokens go to the tile kernel where
// the ISA has one), otherwise one PagedAttention call per token (the one-token kernel): the same
// bits, two speeds. FLOPS = the multiply-adds of q·k and p·v, × 2.
void BM_PagedAttentionPrompt(benchmark::State& state, Isa isa, int64_t chunk, int64_t context,
                             bool whole) {
  std::vector<std::pair<int32_t, int32_t>> tokens;
  for (int64_t t = 0; t < chunk; ++t) {
    tokens.push_back({0, static_cast<int32_t>(context - chunk + t)});
  }
  AttentionCase c(DType::kF16, 1, context, tokens, std::numeric_limits<float>::quiet_NaN(), 3);
  const PagedAttentionParams& p = c.params;
  for (auto _ : state) {
    for (int64_t t = 0; t < (whole ? 1 : chunk); ++t) {
      PagedAttentionParams one = p;
      if (!whole) {
        one.q += t * p.q_token_stride;
        one.out += t * p.out_token_stride;
        one.token_seq += t;
        one.token_pos += t;
        one.num_tokens = 1;
      }
      if (!PagedAttention(one, {.isa = isa}).ok()) {
        state.SkipWithError("PagedAttention failed");
        return;
      }
    }
    benchmark::DoNotOptimize(c.out.data());
  }
  const int64_t positions = chunk * (context - chunk) + chunk * (chunk + 1) / 2;
  state.counters["FLOPS"] = benchmark::Counter(
      static_cast<double>(state.iterations() * positions * AttentionCase::kHeads *
                          AttentionCase::kHeadDim * 4),
      benchmark::Counter::kIsRate);
}

void RegisterAll() {
  struct Shape {
    int64_t k, n;
  };
  // The default model's shapes; then a 1B Llama's ffn_down (K-quants only: what a 1B Q4_K_M
  // file holds as Q4_K or Q6_K).
  const Shape shapes[] = {{576, 1536}, {1536, 576}, {576, 49152}, {8192, 2048}};
  for (Isa isa : kAllIsas) {
    if (!IsaSupported(isa, HostCpuFeatures())) continue;
    const std::string isa_name(IsaName(isa));
    // Q4_1 / Q8_0: the default model; Q4_0; Q5_0, Q4_K, Q6_K: what a Q4_K_M file of it holds;
    // Q5_K: a Q5_K_M file's.
    for (DType type : {DType::kQ4_1, DType::kQ8_0, DType::kQ4_0, DType::kQ5_0, DType::kQ4_K,
                       DType::kQ5_K, DType::kQ6_K}) {
      for (bool packed : {false, true}) {
        // The scalar packed kernels are a reference, not a fallback anyone runs for speed.
        const std::optional<PackedFormat> format = PackedWeights::FormatFor(type);
        if (packed && (!format.has_value() || !PackedKernelIsNative(*format, isa))) continue;
        for (int64_t m : {1, 8, 128}) {
          for (const Shape& s : shapes) {
            if (s.k % DTypeBlockElements(type) != 0) continue;
            // The K-quants stand for ffn_down only (the other matrices of the file are Q5_0);
            // the 1B shape is theirs.
            const bool kquant = DTypeBlockElements(type) == kSuperBlock;
            if (kquant ? s.n > 10000 : s.k > 4096) continue;
            // Scalar prefill of the output layer or a 1B matrix takes seconds per call.
            if (isa == Isa::kScalar && m > 1 && s.n * s.k > 10'000'000) continue;
            const std::string name = std::string(packed ? "MatMulPacked/" : "MatMul/") +
                                     isa_name + "/" + std::string(DTypeName(type)) + "/M" +
                                     std::to_string(m) + "/K" + std::to_string(s.k) + "/N" +
                                     std::to_string(s.n);
            benchmark::RegisterBenchmark(name.c_str(), BM_MatMul, isa, type, m, s.k, s.n, 1,
                                         packed)
                ->Unit(benchmark::kMicrosecond);
          }
        }
      }
    }
    for (DType kv_type : {DType::kF32, DType::kF16}) {
      for (auto [context, seqs] : {std::pair<int64_t, int64_t>{512, 4}, {2048, 4}, {512, 32}}) {
        const std::string name = "PagedAttentionDecode/" + isa_name + "/" +
                                 std::string(DTypeName(kv_type)) + "/ctx" +
                                 std::to_string(context) + "/seqs" + std::to_string(seqs);
        benchmark::RegisterBenchmark(name.c_str(), BM_PagedAttentionDecode, isa, kv_type, context,
                                     seqs)
            ->Unit(benchmark::kMicrosecond);
      }
    }
    for (auto [chunk, context] : {std::pair<int64_t, int64_t>{128, 128}, {512, 512}, {512, 2048}}) {
      for (bool whole : {true, false}) {
        const std::string name = "PagedAttentionPrompt/" + isa_name + "/F16/chunk" +
                                 std::to_string(chunk) + "/ctx" + std::to_string(context) +
                                 (whole ? "/whole" : "/by_token");
        benchmark::RegisterBenchmark(name.c_str(), BM_PagedAttentionPrompt, isa, chunk, context,
                                     whole)
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
  // The decode output layer on every core, best ISA.
  const Isa best = BestIsa(HostCpuFeatures());
  const int threads = static_cast<int>(std::thread::hardware_concurrency());
  const std::string name = "MatMul/" + std::string(IsaName(best)) + "/Q4_1/M1/K576/N49152/threads" +
                           std::to_string(threads);
  benchmark::RegisterBenchmark(name.c_str(), BM_MatMul, best, DType::kQ4_1, 1, 576, 49152, threads,
                               false)
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
}

}  // namespace
}  // namespace tandem::cpu

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  std::printf("CPU features: %s\n",
              tandem::cpu::CpuFeaturesSummary(tandem::cpu::HostCpuFeatures()).c_str());
  tandem::cpu::RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
