// Checks of engine/cuda/elementwise.h against plain CPU references written here (naive loops,
// double where the CPU code uses double), on odd sizes: rows that fill no block evenly, dims 64,
// 96, 128, 576, 1536 and odd ones, padded strides, unaligned pointers (the scalar paths), several
// heads and GQA shapes. The references take the same params structs as the kernels, with host
// pointers. Each check states its tolerance: |got - want| <= abs + rel * |want|.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "engine/cuda/check.h"
#include "engine/cuda/elementwise.h"

namespace tandem::cuda {
namespace {

using check::Bf16BitsToFloat;
using check::DeviceBuffer;
using check::FloatToHalfBits;
using check::HalfBitsToFloat;
using check::Random;

// ---- Conversions, written independently of the project's CPU code ----------------------------

uint16_t FloatToBf16BitsTruncated(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return static_cast<uint16_t>(bits >> 16);
}

// One rounding per operation, whatever the host compiler's contraction setting.
float Mul(float a, float b) {
  volatile float p = a * b;
  return p;
}

std::vector<float> HalvesToFloats(const std::vector<uint16_t>& h) {
  std::vector<float> f(h.size());
  for (size_t i = 0; i < h.size(); ++i) f[i] = HalfBitsToFloat(h[i]);
  return f;
}

// ---- References (host pointers in the kernels' params structs) -------------------------------

void RmsNormReference(const RmsNormParams& p) {
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* x = p.x + r * p.x_stride;
    float* out = p.out + r * p.out_stride;
    const float* src = x;
    if (p.residual != nullptr) {
      float* res = p.residual + r * p.residual_stride;
      for (int64_t i = 0; i < p.dim; ++i) res[i] += x[i];
      src = res;
    }
    double sum_sq = 0;
    for (int64_t i = 0; i < p.dim; ++i) sum_sq += static_cast<double>(src[i]) * src[i];
    const float inv = static_cast<float>(
        1.0 / std::sqrt(sum_sq / static_cast<double>(p.dim) + static_cast<double>(p.eps)));
    for (int64_t i = 0; i < p.dim; ++i) out[i] = Mul(Mul(src[i], inv), p.weight[i]);
  }
}

void CosSinReference(int32_t position, float inv_freq, float* cs) {
  const double theta = static_cast<double>(position) * static_cast<double>(inv_freq);
  cs[0] = static_cast<float>(std::cos(theta));
  cs[1] = static_cast<float>(std::sin(theta));
}

// Rotates pair i of `head` (interleaved: 2i, 2i + 1; NeoX: i, i + half) into `out`.
void RotatePair(const float* head, float* out, RopeStyle style, int64_t i, int64_t half,
                const float* cs) {
  const int64_t lo = style == RopeStyle::kInterleaved ? 2 * i : i;
  const int64_t hi = style == RopeStyle::kInterleaved ? 2 * i + 1 : i + half;
  const float a = head[lo], b = head[hi];
  out[lo] = Mul(a, cs[0]) - Mul(b, cs[1]);
  out[hi] = Mul(a, cs[1]) + Mul(b, cs[0]);
}

void RopeReference(const RopeParams& p) {
  const int64_t half = p.rotary_dim / 2;
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    for (int64_t h = 0; h < p.num_heads; ++h) {
      float* head = p.x + t * p.token_stride + h * p.head_stride;
      for (int64_t i = 0; i < half; ++i) {
        float cs[2];
        CosSinReference(p.positions[t], p.inv_freq[i], cs);
        RotatePair(head, head, p.style, i, half, cs);
      }
    }
  }
}

void WriteKvCacheReference(const KvCacheWriteParams& p) {
  const int64_t half = p.rotary_dim / 2;
  const bool f16 = p.cache_type == KvCacheType::kF16;
  std::vector<float> k(static_cast<size_t>(p.head_dim));
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const int32_t pos = p.token_pos[t];
    if (pos < 0) continue;
    const int64_t block =
        p.block_tables[p.token_seq[t] * p.max_blocks_per_seq + pos / p.block_size];
    const int64_t slot = block * p.block_stride + (pos % p.block_size) * p.token_stride;
    for (int64_t g = 0; g < p.num_kv_heads; ++g) {
      const float* src = p.k + t * p.k_stride + g * p.head_dim;
      k.assign(src, src + p.head_dim);
      for (int64_t i = 0; i < half; ++i) {
        float cs[2];
        CosSinReference(pos, p.inv_freq[i], cs);
        RotatePair(src, k.data(), p.style, i, half, cs);
      }
      const float* v = p.v + t * p.v_stride + g * p.head_dim;
      const int64_t at = slot + g * p.kv_head_stride;
      for (int64_t d = 0; d < p.head_dim; ++d) {
        if (f16) {
          static_cast<uint16_t*>(p.k_cache)[at + d] = FloatToHalfBits(k[d]);
          static_cast<uint16_t*>(p.v_cache)[at + d] = FloatToHalfBits(v[d]);
        } else {
          static_cast<float*>(p.k_cache)[at + d] = k[d];
          static_cast<float*>(p.v_cache)[at + d] = v[d];
        }
        if (p.k_out != nullptr) p.k_out[t * p.k_out_stride + g * p.head_dim + d] = k[d];
      }
    }
  }
}

void SiluMulReference(const SiluMulParams& p) {
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int64_t i = 0; i < p.dim; ++i) {
      const float g = p.gate[r * p.gate_stride + i];
      const float u = p.up[r * p.up_stride + i];
      p.out[r * p.out_stride + i] = g / (1.0f + std::exp(-g)) * u;
    }
  }
}

// Row `id` of a ggml-layout table, dequantized.
void DequantizeRow(WeightType type, const uint8_t* table, int64_t dim, int64_t id, float* out) {
  auto u16 = [](const uint8_t* b) { return static_cast<uint16_t>(b[0] | b[1] << 8); };
  switch (type) {
    case WeightType::kF32:
      std::memcpy(out, table + id * dim * 4, static_cast<size_t>(dim) * 4);
      return;
    case WeightType::kF16:
      for (int64_t i = 0; i < dim; ++i) out[i] = HalfBitsToFloat(u16(table + (id * dim + i) * 2));
      return;
    case WeightType::kBF16:
      for (int64_t i = 0; i < dim; ++i) out[i] = Bf16BitsToFloat(u16(table + (id * dim + i) * 2));
      return;
    case WeightType::kQ8_0:
      for (int64_t i = 0; i < dim; ++i) {
        const uint8_t* block = table + (id * dim / 32 + i / 32) * 34;
        out[i] = Mul(HalfBitsToFloat(u16(block)), static_cast<int8_t>(block[2 + i % 32]));
      }
      return;
    case WeightType::kQ4_0:
    case WeightType::kQ4_1: {
      const bool q4_1 = type == WeightType::kQ4_1;
      const int64_t block_bytes = q4_1 ? 20 : 18;
      for (int64_t i = 0; i < dim; ++i) {
        const uint8_t* block = table + (id * dim / 32 + i / 32) * block_bytes;
        const uint8_t* qs = block + (q4_1 ? 4 : 2);
        const int j = static_cast<int>(i % 32);
        const int nibble = j < 16 ? qs[j] & 0x0F : qs[j - 16] >> 4;
        const float d = HalfBitsToFloat(u16(block));
        out[i] = q4_1 ? Mul(d, static_cast<float>(nibble)) + HalfBitsToFloat(u16(block + 2))
                      : Mul(d, static_cast<float>(nibble - 8));
      }
      return;
    }
  }
}

// ---- Helpers ----------------------------------------------------------------------------------

class Stream {
 public:
  Stream() { cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); }
  ~Stream() { cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// Runs the configurations of a table-driven case one by one, naming each one that fails; the
// case fails when any did.
class ConfigRunner {
 public:
  ConfigRunner() = default;
  ConfigRunner(const ConfigRunner&) = delete;
  ConfigRunner& operator=(const ConfigRunner&) = delete;
  ~ConfigRunner() {
    if (failed_ && !check::CaseFailed()) {
      check::Fail(__FILE__, __LINE__, "a configuration above failed");
    }
  }
  void Run(const std::string& name, const std::function<void()>& run) {
    failed_ = failed_ || check::CaseFailed();
    check::ResetFailure();
    run();
    if (check::CaseFailed()) {
      std::printf("    in configuration: %s\n", name.c_str());
      failed_ = true;
    }
  }

 private:
  bool failed_ = false;
};

// Uniform random bytes from `seed`.
std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> b(n);
  for (uint8_t& x : b) x = static_cast<uint8_t>(rng() >> 24);
  return b;
}

// ---- RmsNorm ------------------------------------------------------------------------------------

struct NormConfig {
  int64_t rows;
  int64_t dim;
  int64_t pad;     // extra floats per row in x, residual and out
  int64_t offset;  // floats before row 0 (1: unaligned, the scalar path)
  bool residual;
  bool in_place;  // out aliases x
  float eps;
  std::string Name() const {
    char buf[160];
    std::snprintf(buf, sizeof(buf),
                  "rows=%lld dim=%lld pad=%lld offset=%lld residual=%d in_place=%d",
                  static_cast<long long>(rows), static_cast<long long>(dim),
                  static_cast<long long>(pad), static_cast<long long>(offset), residual, in_place);
    return buf;
  }
};

void CheckRmsNorm(const NormConfig& c, uint32_t seed) {
  const int64_t stride = c.dim + c.pad;
  const size_t n = static_cast<size_t>(c.offset + c.rows * stride);
  std::vector<float> x = Random(n, seed, -2.0f, 2.0f);
  std::vector<float> residual = Random(n, seed + 1, -2.0f, 2.0f);
  std::vector<float> out = Random(n, seed + 2);
  const std::vector<float> weight = Random(static_cast<size_t>(c.dim), seed + 3, 0.5f, 1.5f);
  DeviceBuffer<float> dx(x), dres(residual), dout(out), dw(weight);

  RmsNormParams host;
  host.x = x.data() + c.offset;
  host.x_stride = stride;
  host.residual = c.residual ? residual.data() + c.offset : nullptr;
  host.residual_stride = stride;
  host.weight = weight.data();
  host.out = (c.in_place ? x.data() : out.data()) + c.offset;
  host.out_stride = stride;
  host.rows = c.rows;
  host.dim = c.dim;
  host.eps = c.eps;
  RmsNormParams dev = host;
  dev.x = dx.get() + c.offset;
  dev.residual = c.residual ? dres.get() + c.offset : nullptr;
  dev.weight = dw.get();
  dev.out = (c.in_place ? dx.get() : dout.get()) + c.offset;
  Stream stream;
  CHECK_CUDA(RmsNorm(dev, stream.get()));
  CHECK_CUDA(cudaStreamSynchronize(stream.get()));
  RmsNormReference(host);
  // The sum of squares in float (tree order) against double: within a few float ulp of the scale.
  CHECK_CLOSE(dout.Download(), out, 1e-5, 1e-5);
  CHECK_CLOSE(dx.Download(), x, 1e-5, 1e-5);
  CHECK_CLOSE(dres.Download(), residual, 0.0, 0.0);  // one float addition: exact
}

TANDEM_CHECK_CASE(RmsNormMatchesTheReference) {
  const NormConfig configs[] = {
      {37, 64, 0, 0, false, false, 1e-5f}, {37, 96, 4, 0, true, false, 1e-6f},
      {5, 128, 0, 0, true, true, 1e-5f},   {300, 576, 8, 0, false, true, 1e-6f},
      {7, 1536, 0, 0, true, false, 1e-5f}, {13, 1536, 3, 1, true, false, 1e-5f},
      {1, 33, 0, 0, true, false, 1e-5f},   {9, 8192, 0, 0, true, false, 1e-5f},
      {3, 100, 2, 1, false, true, 1e-2f},  {65, 4100, 0, 0, true, true, 1e-6f},
  };
  ConfigRunner runner;
  uint32_t seed = 100;
  for (const NormConfig& c : configs) {
    runner.Run(c.Name(), [&] { CheckRmsNorm(c, seed += 10); });
  }
}

// ---- RoPE ---------------------------------------------------------------------------------------

std::vector<float> InvFreq(double theta, int64_t rotary_dim) {
  std::vector<float> f(static_cast<size_t>(rotary_dim / 2));
  for (size_t i = 0; i < f.size(); ++i) {
    f[i] = static_cast<float>(std::pow(theta, -2.0 * static_cast<double>(i) / rotary_dim));
  }
  return f;
}

// Positions of a mixed batch: small ones, ones past 100k (where float angles would be far off),
// zero.
std::vector<int32_t> Positions(int64_t n, uint32_t seed) {
  std::vector<int32_t> pos(static_cast<size_t>(n));
  uint32_t s = seed;
  for (size_t i = 0; i < pos.size(); ++i) {
    s = s * 1664525u + 1013904223u;
    pos[i] =
        i % 3 == 2 ? static_cast<int32_t>(100000 + s % 400000) : static_cast<int32_t>(s % 4096);
  }
  if (!pos.empty()) pos[0] = 0;
  return pos;
}

struct RopeConfig {
  int64_t tokens;
  int64_t heads;
  int64_t head_dim;
  int64_t rotary_dim;
  int64_t head_pad;  // extra floats after each head
  RopeStyle style;
  double theta;
  bool table;  // rotate with a RopeCosSin table
  std::string Name() const {
    char buf[160];
    std::snprintf(buf, sizeof(buf),
                  "tokens=%lld heads=%lld head_dim=%lld rotary_dim=%lld %s table=%d",
                  static_cast<long long>(tokens), static_cast<long long>(heads),
                  static_cast<long long>(head_dim), static_cast<long long>(rotary_dim),
                  style == RopeStyle::kNeox ? "neox" : "interleaved", table);
    return buf;
  }
};

void CheckRope(const RopeConfig& c, uint32_t seed) {
  const int64_t head_stride = c.head_dim + c.head_pad;
  const int64_t token_stride = c.heads * head_stride + 3;
  std::vector<float> x = Random(static_cast<size_t>(c.tokens * token_stride), seed);
  const std::vector<int32_t> positions = Positions(c.tokens, seed);
  const std::vector<float> inv_freq = InvFreq(c.theta, c.rotary_dim);
  DeviceBuffer<float> dx(x), dinv(inv_freq);
  DeviceBuffer<int32_t> dpos(positions);
  DeviceBuffer<float> dtable(static_cast<size_t>(c.tokens * c.rotary_dim));
  Stream stream;
  if (c.table) {
    RopeCosSinParams table;
    table.positions = dpos.get();
    table.num_tokens = c.tokens;
    table.inv_freq = dinv.get();
    table.rotary_dim = c.rotary_dim;
    table.cos_sin = dtable.get();
    CHECK_CUDA(RopeCosSin(table, stream.get()));
    CHECK_CUDA(cudaStreamSynchronize(stream.get()));
    std::vector<float> want(dtable.size());
    const int64_t half = c.rotary_dim / 2;
    for (int64_t t = 0; t < c.tokens; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        CosSinReference(positions[t], inv_freq[i], &want[(t * half + i) * 2]);
      }
    }
    // Double-precision sin/cos on both sides, rounded to float: within one float ulp.
    CHECK_CLOSE(dtable.Download(), want, 1.2e-7, 0.0);
  }
  RopeParams host;
  host.x = x.data();
  host.token_stride = token_stride;
  host.head_stride = head_stride;
  host.num_tokens = c.tokens;
  host.num_heads = c.heads;
  host.head_dim = c.head_dim;
  host.rotary_dim = c.rotary_dim;
  host.positions = positions.data();
  host.inv_freq = inv_freq.data();
  host.style = c.style;
  RopeParams dev = host;
  dev.x = dx.get();
  dev.positions = c.table ? nullptr : dpos.get();
  dev.inv_freq = c.table ? nullptr : dinv.get();
  dev.cos_sin = c.table ? dtable.get() : nullptr;
  CHECK_CUDA(Rope(dev, stream.get()));
  CHECK_CUDA(cudaStreamSynchronize(stream.get()));
  RopeReference(host);
  // Same formula and roundings; cos/sin may differ by one float ulp: |x| <= 1 so 1e-6 absolute.
  // A float-precision angle would miss by ~1e-2 at positions past 100k. Padding must be intact.
  CHECK_CLOSE(dx.Download(), x, 1e-6, 0.0);
}

TANDEM_CHECK_CASE(RopeMatchesTheReference) {
  const RopeConfig configs[] = {
      {37, 9, 64, 64, 0, RopeStyle::kInterleaved, 10000.0, false},  // Q of a GQA model
      {37, 3, 64, 64, 0, RopeStyle::kNeox, 10000.0, false},         // its K
      {5, 32, 128, 128, 0, RopeStyle::kNeox, 500000.0, true},
      {11, 8, 128, 64, 4, RopeStyle::kNeox, 10000.0, false},  // partial rotary, padded
      {11, 8, 128, 64, 4, RopeStyle::kInterleaved, 10000.0, true},
      {3, 12, 96, 96, 0, RopeStyle::kInterleaved, 1000000.0, false},
      {2, 5, 576, 64, 0, RopeStyle::kNeox, 10000.0, true},
      {1, 1, 1536, 1536, 0, RopeStyle::kInterleaved, 10000.0, false},
      {300, 2, 64, 32, 0, RopeStyle::kNeox, 10000.0, false},
  };
  ConfigRunner runner;
  uint32_t seed = 200;
  for (const RopeConfig& c : configs) {
    runner.Run(c.Name(), [&] { CheckRope(c, seed += 10); });
  }
}

// ---- KV cache write -----------------------------------------------------------------------------

struct KvConfig {
  KvCacheType cache_type;
  int64_t num_heads;  // query heads: K and V sit in a fused [T, (heads + 2 * kv_heads) * D] row
  int64_t kv_heads;
  int64_t head_dim;
  int64_t block_size;
  int64_t rotary_dim;  // 0: K is stored as is
  RopeStyle style;
  int k_out;  // 0: none, 1: a separate buffer, 2: in place (k itself)
  bool table;
  std::string Name() const {
    char buf[200];
    std::snprintf(buf, sizeof(buf),
                  "%s heads=%lld kv_heads=%lld head_dim=%lld block_size=%lld rotary_dim=%lld %s "
                  "k_out=%d table=%d",
                  cache_type == KvCacheType::kF16 ? "f16" : "f32", static_cast<long long>(num_heads),
                  static_cast<long long>(kv_heads), static_cast<long long>(head_dim),
                  static_cast<long long>(block_size), static_cast<long long>(rotary_dim),
                  style == RopeStyle::kNeox ? "neox" : "interleaved", k_out, table);
    return buf;
  }
};

void CheckWriteKvCache(const KvConfig& c, uint32_t seed) {
  const bool f16 = c.cache_type == KvCacheType::kF16;
  // Three sequences: a prompt chunk crossing blocks, a decode token, a short prompt; one padding
  // token in the middle. Physical blocks shuffled; layer 1 of a 3-layer pool.
  const int64_t num_layers = 3, layer = 1, num_blocks = 23, max_blocks = 7, num_seqs = 3;
  std::vector<int32_t> tables(static_cast<size_t>(num_seqs * max_blocks));
  for (size_t i = 0; i < tables.size(); ++i)
    tables[i] = static_cast<int32_t>((i * 5 + 3) % num_blocks);
  std::vector<int32_t> seq, pos;
  const int64_t chunk_start = c.block_size - 2;
  for (int64_t p = chunk_start; p < chunk_start + 2 * c.block_size + 1; ++p) {
    seq.push_back(0);
    pos.push_back(static_cast<int32_t>(p));
  }
  seq.push_back(1);
  pos.push_back(-1);  // padding
  seq.push_back(1);
  pos.push_back(static_cast<int32_t>(max_blocks * c.block_size - 1));  // last slot of its table
  for (int32_t p = 0; p < 3; ++p) {
    seq.push_back(2);
    pos.push_back(p);
  }
  const int64_t T = static_cast<int64_t>(pos.size());

  const int64_t D = c.head_dim, Dkv = c.kv_heads * D;
  const int64_t row = (c.num_heads + 2 * c.kv_heads) * D;  // fused q|k|v
  std::vector<float> qkv = Random(static_cast<size_t>(T * row), seed);
  const int64_t k_offset = c.num_heads * D, v_offset = k_offset + Dkv;
  const std::vector<float> inv_freq = InvFreq(10000.0, c.rotary_dim > 0 ? c.rotary_dim : 2);

  const int64_t token_stride = Dkv, kv_stride = c.block_size * Dkv;
  const int64_t block_stride = num_layers * 2 * kv_stride;
  const size_t cache_elements = static_cast<size_t>(num_blocks * block_stride);
  // The pool starts with garbage that must survive outside the written slots.
  const std::vector<float> garbage = Random(cache_elements, seed + 1, -3.0f, 3.0f);
  // Both pools exist (no empty device buffers); the one of the other type stays untouched.
  std::vector<float> cache_f32 = garbage;
  std::vector<uint16_t> cache_f16(garbage.size());
  for (size_t i = 0; i < garbage.size(); ++i) cache_f16[i] = FloatToHalfBits(garbage[i]);
  std::vector<float> k_out(static_cast<size_t>(T * Dkv), 7.0f);

  DeviceBuffer<float> dqkv(qkv), dinv(inv_freq), dk_out(k_out), dcache_f32(cache_f32);
  DeviceBuffer<uint16_t> dcache_f16(cache_f16);
  DeviceBuffer<int32_t> dtables(tables), dseq(seq), dpos(pos);
  DeviceBuffer<float> dtable(static_cast<size_t>(T * (c.rotary_dim > 0 ? c.rotary_dim : 2)));
  Stream stream;
  if (c.table) {
    RopeCosSinParams table;
    table.positions = dpos.get();
    table.num_tokens = T;
    table.inv_freq = dinv.get();
    table.rotary_dim = c.rotary_dim;
    table.cos_sin = dtable.get();
    CHECK_CUDA(RopeCosSin(table, stream.get()));
  }

  const int64_t layer_offset = layer * 2 * kv_stride;
  KvCacheWriteParams host;
  host.k = qkv.data() + k_offset;
  host.k_stride = row;
  host.v = qkv.data() + v_offset;
  host.v_stride = row;
  host.k_cache = f16 ? static_cast<void*>(cache_f16.data() + layer_offset)
                     : static_cast<void*>(cache_f32.data() + layer_offset);
  host.v_cache = f16 ? static_cast<void*>(cache_f16.data() + layer_offset + kv_stride)
                     : static_cast<void*>(cache_f32.data() + layer_offset + kv_stride);
  host.cache_type = c.cache_type;
  host.block_stride = block_stride;
  host.token_stride = token_stride;
  host.kv_head_stride = D;
  host.block_size = c.block_size;
  host.block_tables = tables.data();
  host.max_blocks_per_seq = max_blocks;
  host.token_seq = seq.data();
  host.token_pos = pos.data();
  host.num_tokens = T;
  host.num_kv_heads = c.kv_heads;
  host.head_dim = D;
  host.rotary_dim = c.rotary_dim;
  host.inv_freq = inv_freq.data();
  host.style = c.style;
  host.k_out = c.k_out == 0 ? nullptr : c.k_out == 1 ? k_out.data() : qkv.data() + k_offset;
  host.k_out_stride = c.k_out == 1 ? Dkv : row;
  KvCacheWriteParams dev = host;
  dev.k = dqkv.get() + k_offset;
  dev.v = dqkv.get() + v_offset;
  dev.k_cache = f16 ? static_cast<void*>(dcache_f16.get() + layer_offset)
                    : static_cast<void*>(dcache_f32.get() + layer_offset);
  dev.v_cache = f16 ? static_cast<void*>(dcache_f16.get() + layer_offset + kv_stride)
                    : static_cast<void*>(dcache_f32.get() + layer_offset + kv_stride);
  dev.block_tables = dtables.get();
  dev.token_seq = dseq.get();
  dev.token_pos = dpos.get();
  dev.inv_freq = c.table ? nullptr : dinv.get();
  dev.cos_sin = c.table ? dtable.get() : nullptr;
  dev.k_out = c.k_out == 0 ? nullptr : c.k_out == 1 ? dk_out.get() : dqkv.get() + k_offset;
  CHECK_CUDA(WriteKvCache(dev, stream.get()));
  CHECK_CUDA(cudaStreamSynchronize(stream.get()));
  WriteKvCacheReference(host);

  // Without RoPE a copy (F32) or one rounding to nearest even (F16): exact. With RoPE the rotated
  // value may differ by a float ulp (cos/sin), so |x| <= 1.5 gets 1e-6 in F32 and one half ulp
  // (2^-10 relative) in F16. The whole pool is compared: nothing else may change.
  const bool rope = c.rotary_dim > 0;
  CHECK_CLOSE(HalvesToFloats(dcache_f16.Download()), HalvesToFloats(cache_f16),
              f16 && rope ? 1e-6 : 0.0, f16 && rope ? 1e-3 : 0.0);
  CHECK_CLOSE(dcache_f32.Download(), cache_f32, !f16 && rope ? 1e-6 : 0.0, 0.0);
  CHECK_CLOSE(dk_out.Download(), k_out, rope ? 1e-6 : 0.0, 0.0);  // 7s when not asked for
  CHECK_CLOSE(dqkv.Download(), qkv, rope ? 1e-6 : 0.0, 0.0);  // untouched, or K rotated in place
}

TANDEM_CHECK_CASE(WriteKvCacheMatchesTheReference) {
  const KvConfig configs[] = {
      {KvCacheType::kF16, 9, 3, 64, 16, 0, RopeStyle::kNeox, 0, false},
      {KvCacheType::kF32, 9, 3, 64, 16, 0, RopeStyle::kNeox, 1, false},
      {KvCacheType::kF16, 9, 3, 64, 16, 64, RopeStyle::kInterleaved, 1, false},
      {KvCacheType::kF32, 9, 3, 64, 16, 64, RopeStyle::kNeox, 2, true},
      {KvCacheType::kF16, 32, 8, 128, 16, 128, RopeStyle::kNeox, 0, true},
      {KvCacheType::kF32, 32, 8, 128, 7, 64, RopeStyle::kInterleaved, 2, false},
      {KvCacheType::kF16, 12, 4, 96, 5, 96, RopeStyle::kNeox, 1, false},
      {KvCacheType::kF16, 4, 1, 576, 16, 64, RopeStyle::kNeox, 0, false},
      {KvCacheType::kF32, 2, 2, 1536, 3, 0, RopeStyle::kNeox, 2, false},
  };
  ConfigRunner runner;
  uint32_t seed = 300;
  for (const KvConfig& c : configs) {
    runner.Run(c.Name(), [&] { CheckWriteKvCache(c, seed += 10); });
  }
}

// ---- SiluMul, Add, AddBias ---------------------------------------------------------------------

struct RowsConfig {
  int64_t rows;
  int64_t dim;
  int64_t pad;     // extra floats per row
  int64_t offset;  // floats before row 0 (1: unaligned, the scalar path)
  int alias;       // 0: separate out, 1: out aliases the first input, 2: the second
  std::string Name() const {
    char buf[120];
    std::snprintf(buf, sizeof(buf), "rows=%lld dim=%lld pad=%lld offset=%lld alias=%d",
                  static_cast<long long>(rows), static_cast<long long>(dim),
                  static_cast<long long>(pad), static_cast<long long>(offset), alias);
    return buf;
  }
};

const RowsConfig kRowsConfigs[] = {
    {37, 64, 0, 0, 0},   {7, 96, 4, 0, 1},    {1, 128, 0, 0, 2},
    {300, 576, 0, 0, 0}, {5, 1536, 8, 0, 1},  {13, 1536, 3, 1, 0},
    {9, 35, 0, 0, 2},    {2, 14336, 0, 0, 0}, {70000, 8, 0, 0, 1},
};

// SiluMul on a fused [rows, 2 * dim (+ pad)] gate|up buffer.
void CheckSiluMul(const RowsConfig& c, uint32_t seed) {
  const int64_t stride = 2 * c.dim + c.pad;
  const size_t n = static_cast<size_t>(c.offset + c.rows * stride);
  // Gates in [-30, 30]: both tails of the sigmoid.
  std::vector<float> buf = Random(n, seed, -30.0f, 30.0f);
  std::vector<float> up_scale = Random(n, seed + 1);
  for (int64_t r = 0; r < c.rows; ++r) {  // up in [-1, 1]
    for (int64_t i = 0; i < c.dim; ++i) {
      const size_t at = static_cast<size_t>(c.offset + r * stride + c.dim + i);
      buf[at] = up_scale[at];
    }
  }
  std::vector<float> out = Random(n, seed + 2);
  DeviceBuffer<float> dbuf(buf), dout(out);
  float* gate = buf.data() + c.offset;
  float* up = gate + c.dim;
  SiluMulParams host;
  host.gate = gate;
  host.up = up;
  host.out = c.alias == 0 ? out.data() + c.offset : c.alias == 1 ? gate : up;
  host.gate_stride = host.up_stride = host.out_stride = stride;
  host.rows = c.rows;
  host.dim = c.dim;
  SiluMulParams dev = host;
  dev.gate = dbuf.get() + c.offset;
  dev.up = dev.gate + c.dim;
  dev.out =
      c.alias == 0 ? dout.get() + c.offset : dbuf.get() + c.offset + (c.alias == 1 ? 0 : c.dim);
  Stream stream;
  CHECK_CUDA(SiluMul(dev, stream.get()));
  CHECK_CUDA(cudaStreamSynchronize(stream.get()));
  SiluMulReference(host);
  // expf is within 2 ulp of exp; then an add, a division and a product: a few ulp.
  CHECK_CLOSE(dbuf.Download(), buf, 1e-30, 2e-6);
  CHECK_CLOSE(dout.Download(), out, 1e-30, 2e-6);
}

TANDEM_CHECK_CASE(SiluMulMatchesTheReference) {
  ConfigRunner runner;
  uint32_t seed = 400;
  for (const RowsConfig& c : kRowsConfigs) {
    runner.Run(c.Name(), [&] { CheckSiluMul(c, seed += 10); });
  }
}

void CheckAdd(const RowsConfig& c, uint32_t seed) {
  const int64_t stride = c.dim + c.pad;
  const size_t n = static_cast<size_t>(c.offset + c.rows * stride);
  std::vector<float> a = Random(n, seed), b = Random(n, seed + 1, -5.0f, 5.0f);
  std::vector<float> out = Random(n, seed + 2);
  DeviceBuffer<float> da(a), db(b), dout(out);
  std::vector<float>& host_out = c.alias == 0 ? out : c.alias == 1 ? a : b;
  DeviceBuffer<float>& dev_out = c.alias == 0 ? dout : c.alias == 1 ? da : db;
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t i = 0; i < c.dim; ++i) {
      const size_t at = static_cast<size_t>(c.offset + r * stride + i);
      host_out[at] = a[at] + b[at];
    }
  }
  AddParams p;
  p.a = da.get() + c.offset;
  p.b = db.get() + c.offset;
  p.out = dev_out.get() + c.offset;
  p.a_stride = p.b_stride = p.out_stride = stride;
  p.rows = c.rows;
  p.dim = c.dim;
  Stream stream;
  CHECK_CUDA(Add(p, stream.get()));
  CHECK_CUDA(cudaStreamSynchronize(stream.get()));
  // One float addition per element: exact.
  CHECK_CLOSE(da.Download(), a, 0.0, 0.0);
  CHECK_CLOSE(db.Download(), b, 0.0, 0.0);
  CHECK_CLOSE(dout.Download(), out, 0.0, 0.0);
}

void CheckAddBias(const RowsConfig& c, uint32_t seed) {
  const int64_t stride = c.dim + c.pad;
  const size_t n = static_cast<size_t>(c.offset + c.rows * stride);
  std::vector<float> y = Random(n, seed);
  // The bias shares the rows' misalignment.
  const std::vector<float> bias =
      Random(static_cast<size_t>(c.offset + c.dim), seed + 1, -5.0f, 5.0f);
  DeviceBuffer<float> dy(y), dbias(bias);
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t i = 0; i < c.dim; ++i) {
      y[static_cast<size_t>(c.offset + r * stride + i)] += bias[static_cast<size_t>(c.offset + i)];
    }
  }
  AddBiasParams p;
  p.y = dy.get() + c.offset;
  p.y_stride = stride;
  p.bias = dbias.get() + c.offset;
  p.rows = c.rows;
  p.dim = c.dim;
  Stream stream;
  CHECK_CUDA(AddBias(p, stream.get()));
  CHECK_CUDA(cudaStreamSynchronize(stream.get()));
  CHECK_CLOSE(dy.Download(), y, 0.0, 0.0);  // exact
}

TANDEM_CHECK_CASE(AddAndAddBiasMatchTheReference) {
  ConfigRunner runner;
  uint32_t seed = 500;
  for (const RowsConfig& c : kRowsConfigs) {
    seed += 10;
    runner.Run("Add " + c.Name(), [&] { CheckAdd(c, seed); });
    runner.Run("AddBias " + c.Name(), [&] { CheckAddBias(c, seed + 5); });
  }
}

// ---- Embedding gather ---------------------------------------------------------------------------

// A [vocab, dim] table of `type` with random contents: scales include half subnormals, F16
// elements include subnormals and the largest finite half.
std::vector<uint8_t> RandomTable(WeightType type, int64_t vocab, int64_t dim, uint32_t seed) {
  const int64_t n = vocab * dim;
  const std::vector<float> values = Random(static_cast<size_t>(n), seed, -2.0f, 2.0f);
  std::vector<uint8_t> bytes;
  auto push_u16 = [&bytes](uint16_t v) {
    bytes.push_back(static_cast<uint8_t>(v & 0xFF));
    bytes.push_back(static_cast<uint8_t>(v >> 8));
  };
  switch (type) {
    case WeightType::kF32:
      bytes.resize(static_cast<size_t>(n) * 4);
      std::memcpy(bytes.data(), values.data(), bytes.size());
      break;
    case WeightType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        push_u16(i % 97 == 5   ? static_cast<uint16_t>(0x0001 + i % 0x3FF)  // subnormal
                 : i % 89 == 7 ? uint16_t{0xFBFF}                           // -65504
                               : FloatToHalfBits(values[static_cast<size_t>(i)]));
      }
      break;
    case WeightType::kBF16:
      for (int64_t i = 0; i < n; ++i)
        push_u16(FloatToBf16BitsTruncated(values[static_cast<size_t>(i)] * 1e3f));
      break;
    case WeightType::kQ8_0:
    case WeightType::kQ4_0:
    case WeightType::kQ4_1: {
      const int64_t qs_bytes = type == WeightType::kQ8_0 ? 32 : 16;
      const std::vector<float> scales =
          Random(static_cast<size_t>(n / 32), seed + 1, -0.05f, 0.05f);
      const std::vector<uint8_t> raw =
          RandomBytes(static_cast<size_t>(n / 32 * qs_bytes), seed + 2);
      for (int64_t b = 0; b < n / 32; ++b) {
        const float d = scales[static_cast<size_t>(b)];
        push_u16(b % 11 == 3 ? uint16_t{0x8123} : FloatToHalfBits(d));  // -subnormal sometimes
        if (type == WeightType::kQ4_1)
          push_u16(FloatToHalfBits(values[static_cast<size_t>(b)] * 0.25f));
        for (int64_t j = 0; j < qs_bytes; ++j) {
          bytes.push_back(raw[static_cast<size_t>(b * qs_bytes + j)]);
        }
      }
      break;
    }
  }
  return bytes;
}

void CheckEmbeddingGather(WeightType type, int64_t dim, uint32_t seed) {
  const int64_t vocab = 50, pad = 5;
  const std::vector<uint8_t> table = RandomTable(type, vocab, dim, seed);
  // Repeats, the first and last rows, and two ids out of range (rows of zeros).
  const std::vector<int32_t> ids = {3,  0, 49, 17, 3,  -1, 25, 50, 8, 8,
                                    42, 1, 49, 30, 12, 7,  33, 2,  44};
  const int64_t T = static_cast<int64_t>(ids.size()), stride = dim + pad;
  std::vector<float> out = Random(static_cast<size_t>(T * stride), seed + 3);
  DeviceBuffer<uint8_t> dtable(table);
  DeviceBuffer<int32_t> dids(ids);
  DeviceBuffer<float> dout(out);
  for (int64_t t = 0; t < T; ++t) {
    float* row = out.data() + t * stride;
    if (ids[t] < 0 || ids[t] >= vocab) {
      std::fill(row, row + dim, 0.0f);
    } else {
      DequantizeRow(type, table.data(), dim, ids[t], row);
    }
  }
  EmbeddingGatherParams p;
  p.table = dtable.get();
  p.type = type;
  p.vocab_size = vocab;
  p.dim = dim;
  p.token_ids = dids.get();
  p.num_tokens = T;
  p.out = dout.get();
  p.out_stride = stride;
  Stream stream;
  CHECK_CUDA(EmbeddingGather(p, stream.get()));
  CHECK_CUDA(cudaStreamSynchronize(stream.get()));
  // Exact conversions and single roundings on both sides: bit for bit (padding untouched).
  CHECK_CLOSE(dout.Download(), out, 0.0, 0.0);
}

TANDEM_CHECK_CASE(EmbeddingGatherMatchesTheReference) {
  const int64_t dims[] = {64, 96, 576, 1536, 40};  // 40: not a whole number of quant blocks
  ConfigRunner runner;
  uint32_t seed = 600;
  for (WeightType type : kAllWeightTypes) {
    for (int64_t dim : dims) {
      if (IsQuantized(type) && dim % 32 != 0) continue;  // refused: checked in RejectsWhat...
      seed += 10;
      runner.Run(std::string(WeightTypeName(type)) + " dim=" + std::to_string(dim),
                 [&] { CheckEmbeddingGather(type, dim, seed); });
    }
  }
}

// ---- Parameters that cannot run -----------------------------------------------------------------

TANDEM_CHECK_CASE(RejectsWhatItCannotRunAndSkipsEmptyWork) {
  DeviceBuffer<float> buf(4096);
  DeviceBuffer<int32_t> ints(64);
  float* f = buf.get();
  const int32_t* i32 = ints.get();
  const cudaStream_t s = nullptr;
  // Odd rotary_dim; rotary_dim past head_dim.
  RopeParams rope;
  rope.x = f;
  rope.token_stride = rope.head_stride = rope.head_dim = 64;
  rope.num_tokens = rope.num_heads = 1;
  rope.positions = i32;
  rope.inv_freq = f;
  rope.rotary_dim = 63;
  CHECK_TRUE(Rope(rope, s) == cudaErrorInvalidValue);
  rope.rotary_dim = 66;
  CHECK_TRUE(Rope(rope, s) == cudaErrorInvalidValue);
  // A BF16 cache; RoPE without frequencies.
  KvCacheWriteParams kv;
  kv.k = kv.v = f;
  kv.k_cache = kv.v_cache = f;
  kv.k_stride = kv.v_stride = kv.block_stride = kv.token_stride = kv.kv_head_stride = 64;
  kv.head_dim = 64;
  kv.block_size = kv.max_blocks_per_seq = kv.num_tokens = kv.num_kv_heads = 1;
  kv.block_tables = kv.token_seq = kv.token_pos = i32;
  kv.cache_type = static_cast<KvCacheType>(7);
  CHECK_TRUE(WriteKvCache(kv, s) == cudaErrorInvalidValue);
  kv.cache_type = KvCacheType::kF32;
  kv.rotary_dim = 64;
  CHECK_TRUE(WriteKvCache(kv, s) == cudaErrorInvalidValue);
  // Q8_0 rows that are not whole blocks.
  EmbeddingGatherParams embed;
  embed.table = f;
  embed.type = WeightType::kQ8_0;
  embed.vocab_size = embed.num_tokens = 1;
  embed.dim = embed.out_stride = 40;
  embed.token_ids = i32;
  embed.out = f;
  CHECK_TRUE(EmbeddingGather(embed, s) == cudaErrorInvalidValue);
  // A negative size; a null input with work to do.
  RmsNormParams norm;
  norm.x = norm.weight = norm.out = f;
  norm.x_stride = norm.out_stride = norm.dim = 8;
  norm.rows = -1;
  CHECK_TRUE(RmsNorm(norm, s) == cudaErrorInvalidValue);
  SiluMulParams silu;
  silu.up = silu.out = f;
  silu.rows = 1;
  silu.dim = 8;
  CHECK_TRUE(SiluMul(silu, s) == cudaErrorInvalidValue);
  // Nothing to do: success without a launch, null pointers and all.
  norm = RmsNormParams();
  norm.dim = 8;
  CHECK_TRUE(RmsNorm(norm, s) == cudaSuccess);
  AddParams add;
  add.rows = 3;
  CHECK_TRUE(Add(add, s) == cudaSuccess);
  CHECK_TRUE(AddBias(AddBiasParams(), s) == cudaSuccess);
  embed = EmbeddingGatherParams();
  embed.type = WeightType::kQ4_1;
  embed.dim = 64;
  CHECK_TRUE(EmbeddingGather(embed, s) == cudaSuccess);
  RopeCosSinParams table;
  table.rotary_dim = 64;
  CHECK_TRUE(RopeCosSin(table, s) == cudaSuccess);
  CHECK_CUDA(cudaGetLastError());
}

}  // namespace
}  // namespace tandem::cuda
