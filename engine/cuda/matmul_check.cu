// Checks of engine/cuda/matmul.h against a plain CPU reference written here: weights made from
// random floats by this file's own quantizers (ggml's reference ones: Q8_0, Q4_0, Q4_1; F16 / BF16
// rounded to nearest even), dequantized again by this file's own decoder, and products in double.
//
// Tolerance, for every output y[i, j]: |got - want| <= rel * |x_i| * |w_j| (Euclidean norms of
// the activation row and of the dequantized weight row, which bound sum_k |x_k * w_k|), with rel
// by path:
//   1e-5  GEMV (every type) and the F32 tiled kernel: float arithmetic on exact inputs (random
//         data stays far below the k * 2^-24 worst case of float sums);
//   2e-3  tiled / cuBLAS with half inputs (F16, Q8_0, Q4_0, Q4_1): x and the dequantized w each
//         rounded to half, 2 * 2^-11, plus float sums;
//   8e-3  tiled / cuBLAS with BF16 weights: x rounded to bfloat16, 2^-8, with a factor 2 margin.
// y's padding columns (j >= n) must keep the sentinel they were filled with, and the padding of x
// and of W rows holds NaN (0xFF bytes), so a kernel that writes or uses padding fails.
//
// Coverage: every weight type x m in {1, 3, 8, 17, 64, 257} x n in {96, 576, 1000} x k in {64,
// 576, 1536} through the dispatcher (MatMul); each path forced (GEMV also for m > 8, tiled also
// for small m and for F16 / BF16) on padded strides and on unaligned x and W (the scalar x loads;
// W rows starting anywhere on a 2-byte boundary, the tensor 6 bytes into its allocation); float
// types with k not a multiple of 4 or 32; MatMulShared against separate MatMul calls (bit-exact);
// the dispatch rule; the parameters that are rejected.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/cuda/check.h"
#include "engine/cuda/matmul.h"

namespace tandem::cuda {
namespace {

using check::DeviceBuffer;

// ---- Conversions, written independently of the project's CPU code ----------------------------

using check::FloatToBf16Bits;
using check::FloatToHalfBits;
double HalfBitsToDouble(uint16_t h) { return check::HalfBitsToFloat(h); }
double Bf16BitsToDouble(uint16_t b) { return check::Bf16BitsToFloat(b); }

void PutU16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v & 0xFF);
  p[1] = static_cast<uint8_t>(v >> 8);
}

uint16_t GetU16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }

// ---- Quantization (ggml's reference quantizers) and dequantization --------------------------

void QuantizeRow(WeightType type, const float* src, int64_t k, uint8_t* dst) {
  switch (type) {
    case WeightType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(k) * 4);
      return;
    case WeightType::kF16:
      for (int64_t i = 0; i < k; ++i) PutU16(dst + 2 * i, FloatToHalfBits(src[i]));
      return;
    case WeightType::kBF16:
      for (int64_t i = 0; i < k; ++i) PutU16(dst + 2 * i, FloatToBf16Bits(src[i]));
      return;
    case WeightType::kQ8_0:
      for (int64_t b = 0; b < k / 32; ++b, src += 32, dst += 34) {
        float amax = 0.0f;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(src[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        PutU16(dst, FloatToHalfBits(d));
        for (int j = 0; j < 32; ++j) {
          dst[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::nearbyint(src[j] * id)));
        }
      }
      return;
    case WeightType::kQ4_0:
      for (int64_t b = 0; b < k / 32; ++b, src += 32, dst += 18) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 32; ++j) {
          if (amax < std::fabs(src[j])) {
            amax = std::fabs(src[j]);
            max = src[j];
          }
        }
        const float d = max / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        PutU16(dst, FloatToHalfBits(d));
        for (int j = 0; j < 16; ++j) {
          const int lo = std::min(15, static_cast<int>(src[j] * id + 8.5f));
          const int hi = std::min(15, static_cast<int>(src[16 + j] * id + 8.5f));
          dst[2 + j] = static_cast<uint8_t>(lo | hi << 4);
        }
      }
      return;
    case WeightType::kQ4_1:
      for (int64_t b = 0; b < k / 32; ++b, src += 32, dst += 20) {
        float min = src[0], max = src[0];
        for (int j = 1; j < 32; ++j) {
          min = std::min(min, src[j]);
          max = std::max(max, src[j]);
        }
        const float d = (max - min) / 15.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        PutU16(dst, FloatToHalfBits(d));
        PutU16(dst + 2, FloatToHalfBits(min));
        for (int j = 0; j < 16; ++j) {
          const int lo = std::min(15, static_cast<int>((src[j] - min) * id + 0.5f));
          const int hi = std::min(15, static_cast<int>((src[16 + j] - min) * id + 0.5f));
          dst[4 + j] = static_cast<uint8_t>(lo | hi << 4);
        }
      }
      return;
  }
}

// The exact values of one stored row: d · q (+ m) with d and m as stored (half).
void DequantizeRow(WeightType type, const uint8_t* src, int64_t k, double* dst) {
  switch (type) {
    case WeightType::kF32:
      for (int64_t i = 0; i < k; ++i) {
        float f;
        std::memcpy(&f, src + 4 * i, 4);
        dst[i] = f;
      }
      return;
    case WeightType::kF16:
      for (int64_t i = 0; i < k; ++i) dst[i] = HalfBitsToDouble(GetU16(src + 2 * i));
      return;
    case WeightType::kBF16:
      for (int64_t i = 0; i < k; ++i) dst[i] = Bf16BitsToDouble(GetU16(src + 2 * i));
      return;
    case WeightType::kQ8_0:
      for (int64_t b = 0; b < k / 32; ++b, src += 34, dst += 32) {
        const double d = HalfBitsToDouble(GetU16(src));
        for (int j = 0; j < 32; ++j) dst[j] = d * static_cast<int8_t>(src[2 + j]);
      }
      return;
    case WeightType::kQ4_0:
    case WeightType::kQ4_1: {
      const bool q4_1 = type == WeightType::kQ4_1;
      const int64_t block_bytes = q4_1 ? 20 : 18;
      const uint8_t* qs_at = src + (q4_1 ? 4 : 2);
      for (int64_t b = 0; b < k / 32; ++b, src += block_bytes, qs_at += block_bytes, dst += 32) {
        const double d = HalfBitsToDouble(GetU16(src));
        const double m = q4_1 ? HalfBitsToDouble(GetU16(src + 2)) : -8.0 * d;
        for (int j = 0; j < 16; ++j) {
          dst[j] = d * (qs_at[j] & 0x0F) + m;
          dst[16 + j] = d * (qs_at[j] >> 4) + m;
        }
      }
      return;
    }
  }
}

// ---- Test data -----------------------------------------------------------------------------

// Weights [n, k] of `type`: row j at bytes[offset + j * row_bytes]; the bytes before row 0 and
// after each row's data are 0xFF (NaN in every type).
struct Weights {
  WeightType type = WeightType::kF32;
  int64_t n = 0, k = 0, row_bytes = 0, offset = 0;
  std::vector<uint8_t> bytes;
  std::vector<double> values;  // [n, k], dequantized
  std::vector<double> norms;   // [n]
};

Weights MakeWeights(WeightType type, int64_t n, int64_t k, int64_t row_pad, int64_t offset,
                    uint32_t seed) {
  Weights w;
  w.type = type;
  w.n = n;
  w.k = k;
  w.row_bytes = WeightRowBytes(type, k) + row_pad;
  w.offset = offset;
  w.bytes.assign(static_cast<size_t>(offset + n * w.row_bytes), 0xFF);
  w.values.resize(static_cast<size_t>(n * k));
  w.norms.resize(static_cast<size_t>(n));
  const std::vector<float> floats = check::Random(static_cast<size_t>(n * k), seed);
  for (int64_t j = 0; j < n; ++j) {
    uint8_t* row = w.bytes.data() + offset + j * w.row_bytes;
    QuantizeRow(type, floats.data() + j * k, k, row);
    double* values = w.values.data() + j * k;
    DequantizeRow(type, row, k, values);
    double sum = 0;
    for (int64_t i = 0; i < k; ++i) sum += values[i] * values[i];
    w.norms[static_cast<size_t>(j)] = std::sqrt(sum);
  }
  return w;
}

// Activations [m, k]: row i at data[offset + i * stride]; padding and the offset hold NaN. The
// buffer ends right after the last row's k-th element.
struct Activations {
  int64_t m = 0, k = 0, stride = 0, offset = 0;
  std::vector<float> data;
  std::vector<double> norms;  // [m]
};

Activations MakeActivations(int64_t m, int64_t k, int64_t stride, int64_t offset, uint32_t seed) {
  Activations x;
  x.m = m;
  x.k = k;
  x.stride = stride;
  x.offset = offset;
  x.data.assign(static_cast<size_t>(offset + (m - 1) * stride + k), NAN);
  x.norms.resize(static_cast<size_t>(m));
  const std::vector<float> values = check::Random(static_cast<size_t>(m * k), seed);
  for (int64_t i = 0; i < m; ++i) {
    double sum = 0;
    for (int64_t c = 0; c < k; ++c) {
      const float v = values[static_cast<size_t>(i * k + c)];
      x.data[static_cast<size_t>(offset + i * stride + c)] = v;
      sum += static_cast<double>(v) * v;
    }
    x.norms[static_cast<size_t>(i)] = std::sqrt(sum);
  }
  return x;
}

// want[i * n + j] = Σ_c x[i, c] · w[j, c] in double, for the first `rows` rows of x.
std::vector<double> Reference(const Activations& x, int64_t rows, const Weights& w) {
  const int64_t k = w.k;
  std::vector<double> want(static_cast<size_t>(rows * w.n));
  std::vector<double> xd(static_cast<size_t>(k));
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t c = 0; c < k; ++c)
      xd[c] = x.data[static_cast<size_t>(x.offset + i * x.stride + c)];
    for (int64_t j = 0; j < w.n; ++j) {
      const double* wr = w.values.data() + j * k;
      double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      int64_t c = 0;
      for (; c + 4 <= k; c += 4) {
        s0 += xd[c] * wr[c];
        s1 += xd[c + 1] * wr[c + 1];
        s2 += xd[c + 2] * wr[c + 2];
        s3 += xd[c + 3] * wr[c + 3];
      }
      for (; c < k; ++c) s0 += xd[c] * wr[c];
      want[static_cast<size_t>(i * w.n + j)] = (s0 + s1) + (s2 + s3);
    }
  }
  return want;
}

// ---- Running and comparing -----------------------------------------------------------------

constexpr float kSentinel = -12345.0f;

const char* PathName(MatMulPath path) {
  switch (path) {
    case MatMulPath::kGemv:
      return "gemv";
    case MatMulPath::kCublas:
      return "cublas";
    case MatMulPath::kTiled:
      return "tiled";
  }
  return "?";
}

// The tolerance of a path, relative to ‖x_i‖ ‖w_j‖ (see the top of the file).
double Tolerance(MatMulPath path, WeightType type) {
  if (path == MatMulPath::kGemv || type == WeightType::kF32) return 1e-5;
  if (type == WeightType::kBF16) return 8e-3;
  return 2e-3;
}

// Device copies of a problem's inputs.
struct DeviceProblem {
  DeviceBuffer<uint8_t> w;
  DeviceBuffer<float> x;
  DeviceProblem(const Weights& weights, const Activations& activations)
      : w(weights.bytes), x(activations.data) {}
};

// MatMulParams for the first m rows of `x`, writing y with row stride y_stride.
MatMulParams ParamsFor(const DeviceProblem& d, const Weights& w, const Activations& x, int64_t m,
                       float* y, int64_t y_stride) {
  MatMulParams p;
  p.x = d.x.get() + x.offset;
  p.x_stride = x.stride;
  p.w = d.w.get() + w.offset;
  p.w_type = w.type;
  p.w_row_bytes = w.row_bytes == WeightRowBytes(w.type, w.k) ? 0 : w.row_bytes;  // 0: packed
  p.y = y;
  p.y_stride = y_stride;
  p.m = m;
  p.n = w.n;
  p.k = w.k;
  return p;
}

// Compares y [m, y_stride] with want (first m rows of an [*, n] product); "" when within
// tolerance, else what is wrong.
std::string Compare(const std::vector<float>& y, int64_t y_stride, int64_t m,
                    const std::vector<double>& want, const Activations& x, const Weights& w,
                    double rel) {
  const int64_t n = w.n;
  int64_t bad = 0, worst_i = 0, worst_j = 0;
  double worst = -1;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < y_stride; ++j) {
      const float got = y[static_cast<size_t>(i * y_stride + j)];
      double excess;
      if (j >= n) {
        excess = got == kSentinel ? 0.0 : INFINITY;  // padding written
      } else {
        const double err = std::fabs(got - want[static_cast<size_t>(i * n + j)]);
        const double allowed =
            rel * x.norms[static_cast<size_t>(i)] * w.norms[static_cast<size_t>(j)];
        excess = err <= allowed ? 0.0 : (std::isnan(err) ? INFINITY : err - allowed);
      }
      if (excess > 0) {
        ++bad;
        if (excess > worst) {
          worst = excess;
          worst_i = i;
          worst_j = j;
        }
      }
    }
  }
  if (bad == 0) return "";
  char buf[320];
  const double want_at = worst_j < n ? want[static_cast<size_t>(worst_i * n + worst_j)] : kSentinel;
  const double allowed = worst_j < n ? rel * x.norms[static_cast<size_t>(worst_i)] *
                                           w.norms[static_cast<size_t>(worst_j)]
                                     : 0.0;
  std::snprintf(buf, sizeof(buf),
                "%lld of %lld outputs wrong; worst y[%lld, %lld] = %.9g, want %.9g (allowed "
                "error %.3g)",
                static_cast<long long>(bad), static_cast<long long>(m * y_stride),
                static_cast<long long>(worst_i), static_cast<long long>(worst_j),
                static_cast<double>(y[static_cast<size_t>(worst_i * y_stride + worst_j)]), want_at,
                allowed);
  return buf;
}

std::string Describe(WeightType type, int64_t m, int64_t n, int64_t k, const char* layout,
                     MatMulPath path) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%s m=%lld n=%lld k=%lld layout=%s path=%s", WeightTypeName(type),
                static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
                layout, PathName(path));
  return buf;
}

// A context with a cuBLAS handle and a workspace, destroyed with the case.
class TestContext {
 public:
  explicit TestContext(size_t workspace_bytes) : workspace_(workspace_bytes) {
    status_ = CreateMatMulContext(&context_);
    context_.workspace = workspace_.get();
    context_.workspace_bytes = workspace_bytes;
  }
  ~TestContext() { DestroyMatMulContext(&context_); }
  TestContext(const TestContext&) = delete;
  TestContext& operator=(const TestContext&) = delete;
  cudaError_t status() const { return status_; }
  const MatMulContext& get() const { return context_; }

 private:
  DeviceBuffer<uint8_t> workspace_;
  MatMulContext context_;
  cudaError_t status_ = cudaSuccess;
};

cudaError_t RunPath(MatMulPath path, const MatMulParams& p, const MatMulContext& context) {
  switch (path) {
    case MatMulPath::kGemv:
      return MatMulGemv(p, nullptr);
    case MatMulPath::kCublas:
      return MatMulCublas(p, context, nullptr);
    case MatMulPath::kTiled:
      return MatMulTiled(p, nullptr);
  }
  return cudaErrorInvalidValue;
}

// Runs one product (through `path`, or the dispatcher when `dispatch`) and compares it with the
// reference; reports a failure and returns false when it differs.
bool RunAndCompare(const DeviceProblem& d, const Weights& w, const Activations& x, int64_t m,
                   const std::vector<double>& want, int64_t y_pad, bool dispatch, MatMulPath path,
                   const MatMulContext& context, const char* layout) {
  const int64_t y_stride = w.n + y_pad;
  DeviceBuffer<float> y(std::vector<float>(static_cast<size_t>(m * y_stride), kSentinel));
  const MatMulParams p = ParamsFor(d, w, x, m, y.get(), y_stride);
  if (dispatch) path = SelectMatMulPath(p, context);
  const std::string what = Describe(w.type, m, w.n, w.k, layout, path);
  cudaError_t e = dispatch ? MatMul(p, context, nullptr) : RunPath(path, p, context);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    check::Fail(__FILE__, __LINE__, what + ": " + cudaGetErrorString(e));
    return false;
  }
  const std::string why = Compare(y.Download(), y_stride, m, want, x, w, Tolerance(path, w.type));
  if (!why.empty()) {
    check::Fail(__FILE__, __LINE__, what + ": " + why);
    return false;
  }
  return true;
}

uint32_t Seed(WeightType type, int64_t n, int64_t k) {
  return static_cast<uint32_t>(static_cast<int64_t>(type) * 1000003 + n * 7919 + k);
}

// ---- The grid through the dispatcher -------------------------------------------------------

void CheckGrid(WeightType type) {
  const int64_t ms[] = {1, 3, 8, 17, 64, 257};
  const int64_t ns[] = {96, 576, 1000};
  const int64_t ks[] = {64, 576, 1536};
  TestContext context(MatMulWorkspaceBytes(257, 1536));
  CHECK_CUDA(context.status());
  int failures = 0;
  for (int64_t n : ns) {
    for (int64_t k : ks) {
      const Weights w = MakeWeights(type, n, k, 0, 0, Seed(type, n, k));
      const Activations x = MakeActivations(257, k, k, 0, Seed(type, n, k) + 1);
      const std::vector<double> want = Reference(x, 257, w);
      const DeviceProblem d(w, x);
      for (int64_t m : ms) {
        if (!RunAndCompare(d, w, x, m, want, 0, /*dispatch=*/true, MatMulPath::kGemv, context.get(),
                           "packed") &&
            ++failures >= 5) {
          return;
        }
      }
    }
  }
}

TANDEM_CHECK_CASE(MatMulF32MatchesTheReferenceOnTheGrid) { CheckGrid(WeightType::kF32); }
TANDEM_CHECK_CASE(MatMulF16MatchesTheReferenceOnTheGrid) { CheckGrid(WeightType::kF16); }
TANDEM_CHECK_CASE(MatMulBF16MatchesTheReferenceOnTheGrid) { CheckGrid(WeightType::kBF16); }
TANDEM_CHECK_CASE(MatMulQ8_0MatchesTheReferenceOnTheGrid) { CheckGrid(WeightType::kQ8_0); }
TANDEM_CHECK_CASE(MatMulQ4_0MatchesTheReferenceOnTheGrid) { CheckGrid(WeightType::kQ4_0); }
TANDEM_CHECK_CASE(MatMulQ4_1MatchesTheReferenceOnTheGrid) { CheckGrid(WeightType::kQ4_1); }

// ---- Each path on its own, with awkward layouts ---------------------------------------------

struct Layout {
  const char* name;
  int64_t x_pad;     // x_stride = k + x_pad
  int64_t x_offset;  // floats before row 0 (1: x is not 16-byte aligned)
  int64_t y_pad;     // y_stride = n + y_pad
  int64_t w_pad;     // bytes after each W row (keeps 4-byte alignment for F32)
  int64_t w_offset;  // bytes before row 0 (likewise)
};

Layout LayoutFor(int which, WeightType type) {
  const bool f32 = type == WeightType::kF32;
  switch (which) {
    case 0:
      return {"packed", 0, 0, 0, 0, 0};
    case 1:
      return {"padded", 4, 0, 3, 16, 0};
    default:
      return {"unaligned", 1, 1, 1, f32 ? 4 : 2, f32 ? 12 : 6};
  }
}

std::vector<MatMulPath> PathsFor(WeightType type) {
  if (type == WeightType::kF16 || type == WeightType::kBF16) {
    return {MatMulPath::kGemv, MatMulPath::kTiled, MatMulPath::kCublas};
  }
  return {MatMulPath::kGemv, MatMulPath::kTiled};
}

void CheckShapes(WeightType type, const std::vector<std::array<int64_t, 3>>& shapes, int layouts,
                 int* failures) {
  TestContext context(MatMulWorkspaceBytes(257, 1536));
  CHECK_CUDA(context.status());
  for (const auto& [m, n, k] : shapes) {
    for (int l = 0; l < layouts; ++l) {
      const Layout layout = LayoutFor(l, type);
      const uint32_t seed = Seed(type, n, k) + 17 * static_cast<uint32_t>(l);
      const Weights w = MakeWeights(type, n, k, layout.w_pad, layout.w_offset, seed);
      const Activations x = MakeActivations(m, k, k + layout.x_pad, layout.x_offset, seed + 1);
      const std::vector<double> want = Reference(x, m, w);
      const DeviceProblem d(w, x);
      for (MatMulPath path : PathsFor(type)) {
        if (!RunAndCompare(d, w, x, m, want, layout.y_pad, /*dispatch=*/false, path, context.get(),
                           layout.name) &&
            ++*failures >= 5) {
          return;
        }
      }
    }
  }
}

TANDEM_CHECK_CASE(MatMulEachPathMatchesTheReference) {
  const std::vector<std::array<int64_t, 3>> shapes = {
      {1, 96, 64}, {5, 1000, 576}, {17, 576, 1536}, {64, 1000, 64}, {130, 97, 576}};
  int failures = 0;
  for (WeightType type : kAllWeightTypes) {
    CheckShapes(type, shapes, 3, &failures);
    if (failures >= 5 || check::CaseFailed()) return;
  }
}

// F32 / F16 / BF16 rows need not be whole blocks, nor whole quads; k = 0 writes zeros.
TANDEM_CHECK_CASE(MatMulFloatWeightsTakeAnyK) {
  std::vector<std::array<int64_t, 3>> shapes;
  for (int64_t k : {0, 1, 3, 37, 100, 130, 290}) {
    for (int64_t m : {1, 5, 70}) shapes.push_back({m, 33, k});
  }
  int failures = 0;
  for (WeightType type : {WeightType::kF32, WeightType::kF16, WeightType::kBF16}) {
    CheckShapes(type, shapes, 3, &failures);
    if (failures >= 5 || check::CaseFailed()) return;
  }
}

// ---- MatMulShared --------------------------------------------------------------------------

// Products of one x (Q/K/V of a GQA layer, or gate/up) in one call equal separate MatMul calls
// bit for bit, and the reference within the path's tolerance; a group of mixed types runs too.
TANDEM_CHECK_CASE(MatMulSharedEqualsSeparateProducts) {
  TestContext context(MatMulWorkspaceBytes(20, 576));
  CHECK_CUDA(context.status());
  const int64_t k = 576;
  const std::vector<std::vector<int64_t>> groups = {{576, 96, 96}, {1000, 1000}, {33}};
  for (WeightType type : kAllWeightTypes) {
    for (const std::vector<int64_t>& ns : groups) {
      for (int64_t m : {1, 3, 8, 20}) {
        const Activations x = MakeActivations(m, k, k, 0, Seed(type, m, k) + 5);
        const DeviceBuffer<float> dx(x.data);
        std::vector<Weights> ws;
        for (size_t j = 0; j < ns.size(); ++j) {
          ws.push_back(MakeWeights(type, ns[j], k, 0, 0, Seed(type, ns[j], k) + 3 * j));
        }
        std::vector<std::unique_ptr<DeviceBuffer<uint8_t>>> dws;
        std::vector<std::unique_ptr<DeviceBuffer<float>>> shared_y, single_y;
        std::vector<MatMulParams> params;
        for (const Weights& w : ws) {
          dws.push_back(std::make_unique<DeviceBuffer<uint8_t>>(w.bytes));
          shared_y.push_back(std::make_unique<DeviceBuffer<float>>(static_cast<size_t>(m * w.n)));
          single_y.push_back(std::make_unique<DeviceBuffer<float>>(static_cast<size_t>(m * w.n)));
          MatMulParams p;
          p.x = dx.get();
          p.x_stride = k;
          p.w = dws.back()->get();
          p.w_type = type;
          p.y = shared_y.back()->get();
          p.y_stride = w.n;
          p.m = m;
          p.n = w.n;
          p.k = k;
          params.push_back(p);
        }
        cudaError_t e =
            MatMulShared(params.data(), static_cast<int>(params.size()), context.get(), nullptr);
        for (size_t j = 0; j < params.size() && e == cudaSuccess; ++j) {
          MatMulParams p = params[j];
          p.y = single_y[j]->get();
          e = MatMul(p, context.get(), nullptr);
        }
        if (e == cudaSuccess) e = cudaDeviceSynchronize();
        std::string why = e == cudaSuccess ? "" : cudaGetErrorString(e);
        for (size_t j = 0; j < params.size() && why.empty(); ++j) {
          const std::vector<float> got = shared_y[j]->Download();
          if (got != single_y[j]->Download()) {
            why = "product " + std::to_string(j) + " differs from MatMul";
          }
          const MatMulPath path = SelectMatMulPath(params[j], context.get());
          const std::string cmp =
              Compare(got, ws[j].n, m, Reference(x, m, ws[j]), x, ws[j], Tolerance(path, type));
          if (why.empty() && !cmp.empty()) why = "product " + std::to_string(j) + ": " + cmp;
        }
        if (!why.empty()) {
          check::Fail(__FILE__, __LINE__,
                      std::string(WeightTypeName(type)) + " m=" + std::to_string(m) +
                          " products=" + std::to_string(ns.size()) + ": " + why);
          return;
        }
      }
    }
  }
  // Mixed types: one product per call underneath; each still matches the reference.
  const int64_t m = 2;
  const Activations x = MakeActivations(m, k, k, 0, 99);
  const DeviceBuffer<float> dx(x.data);
  const WeightType types[] = {WeightType::kQ8_0, WeightType::kQ4_0, WeightType::kF16};
  std::vector<Weights> ws;
  for (WeightType t : types) ws.push_back(MakeWeights(t, 96, k, 0, 0, Seed(t, 96, k) + 11));
  const DeviceBuffer<uint8_t> w0(ws[0].bytes), w1(ws[1].bytes), w2(ws[2].bytes);
  DeviceBuffer<float> y0(m * 96), y1(m * 96), y2(m * 96);
  const DeviceBuffer<uint8_t>* dw[] = {&w0, &w1, &w2};
  DeviceBuffer<float>* dy[] = {&y0, &y1, &y2};
  MatMulParams params[3];
  for (int j = 0; j < 3; ++j) {
    params[j].x = dx.get();
    params[j].x_stride = k;
    params[j].w = dw[j]->get();
    params[j].w_type = types[j];
    params[j].y = dy[j]->get();
    params[j].y_stride = 96;
    params[j].m = m;
    params[j].n = 96;
    params[j].k = k;
  }
  CHECK_CUDA(MatMulShared(params, 3, context.get(), nullptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  for (int j = 0; j < 3; ++j) {
    const std::string why = Compare(dy[j]->Download(), 96, m, Reference(x, m, ws[j]), x, ws[j],
                                    Tolerance(MatMulPath::kGemv, types[j]));
    CHECK_TRUE(why.empty());
  }
}

// ---- The dispatch rule and the rejected parameters -------------------------------------------

TANDEM_CHECK_CASE(MatMulDispatchFollowsTheRule) {
  TestContext context(MatMulWorkspaceBytes(64, 128));
  CHECK_CUDA(context.status());
  MatMulParams p;
  p.k = 128;
  p.n = 64;
  p.x_stride = 128;
  p.y_stride = 64;
  auto path = [&](WeightType type, int64_t m, const MatMulContext& c) {
    p.w_type = type;
    p.m = m;
    return SelectMatMulPath(p, c);
  };
  const MatMulContext none;
  for (WeightType type : kAllWeightTypes) {
    CHECK_TRUE(path(type, 1, context.get()) == MatMulPath::kGemv);
    CHECK_TRUE(path(type, kGemvMaxRows, context.get()) == MatMulPath::kGemv);
    const bool half = type == WeightType::kF16 || type == WeightType::kBF16;
    CHECK_TRUE(path(type, 9, context.get()) == (half ? MatMulPath::kCublas : MatMulPath::kTiled));
    CHECK_TRUE(path(type, 64, context.get()) == (half ? MatMulPath::kCublas : MatMulPath::kTiled));
    CHECK_TRUE(path(type, 65, context.get()) == MatMulPath::kTiled);  // workspace too small
    CHECK_TRUE(path(type, 64, none) == MatMulPath::kTiled);
  }
}

TANDEM_CHECK_CASE(MatMulRejectsWhatItCannotRun) {
  DeviceBuffer<float> x(64 * 4), y(64 * 4);
  DeviceBuffer<uint8_t> w(64 * 64 * 4 + 16);
  MatMulParams good;
  good.x = x.get();
  good.x_stride = 64;
  good.w = w.get();
  good.w_type = WeightType::kQ8_0;
  good.y = y.get();
  good.y_stride = 64;
  good.m = 4;
  good.n = 64;
  good.k = 64;
  const MatMulContext none;
  auto rejected = [&](const MatMulParams& p) {
    return MatMul(p, none, nullptr) == cudaErrorInvalidValue &&
           MatMulGemv(p, nullptr) == cudaErrorInvalidValue &&
           MatMulTiled(p, nullptr) == cudaErrorInvalidValue;
  };
  MatMulParams p = good;
  p.k = 48;  // not whole Q8_0 blocks
  p.x_stride = 48;
  CHECK_TRUE(rejected(p));
  p = good;
  p.x_stride = 63;
  CHECK_TRUE(rejected(p));
  p = good;
  p.y_stride = 63;
  CHECK_TRUE(rejected(p));
  p = good;
  p.w_row_bytes = 66;  // < 68 bytes of a packed row
  CHECK_TRUE(rejected(p));
  p = good;
  p.w = w.get() + 1;  // odd address
  CHECK_TRUE(rejected(p));
  p = good;
  p.w_type = WeightType::kF32;
  p.w = w.get() + 2;  // F32 needs 4-byte alignment
  CHECK_TRUE(rejected(p));
  p = good;
  p.w = nullptr;
  CHECK_TRUE(rejected(p));
  p = good;
  p.y = nullptr;
  CHECK_TRUE(rejected(p));
  p = good;
  p.m = -1;
  CHECK_TRUE(rejected(p));
  // cuBLAS only for F16 / BF16, with a handle and a workspace.
  p = good;
  CHECK_TRUE(MatMulCublas(p, none, nullptr) == cudaErrorInvalidValue);
  p.w_type = WeightType::kF16;
  p.k = 64;
  CHECK_TRUE(MatMulCublas(p, none, nullptr) == cudaErrorInvalidValue);
  // Nothing to do is success.
  p = good;
  p.m = 0;
  CHECK_TRUE(MatMul(p, none, nullptr) == cudaSuccess);
  p = good;
  p.n = 0;
  p.y = nullptr;
  CHECK_TRUE(MatMul(p, none, nullptr) == cudaSuccess);
  CHECK_TRUE(MatMulShared(nullptr, 0, none, nullptr) == cudaSuccess);
  CHECK_TRUE(MatMulShared(nullptr, -1, none, nullptr) == cudaErrorInvalidValue);
  MatMulParams two[2] = {good, good};
  two[1].k = 40;
  CHECK_TRUE(MatMulShared(two, 2, none, nullptr) == cudaErrorInvalidValue);
  CHECK_CUDA(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace tandem::cuda
