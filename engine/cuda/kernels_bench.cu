// Speed of the CUDA kernels on the shapes of an 8B Llama-3 layer (hidden 4096, 32 query / 8 KV
// heads of 128, MLP 14336), on random data: the matrix products for one decode token (GEMV:
// bandwidth, since each reads its weights once), for a decode batch of 64 and a prefill of 512
// tokens (through MatMul's dispatch: TFLOP/s), and paged attention decode over a 2048-token
// context for 64 sequences (bandwidth of the KV read). Each figure is the median of 20 timed
// runs (CUDA events) after 3 warm-up runs, next to the device's own copy bandwidth measured here
// (cudaMemcpy device to device) and the H200's datasheet 4.8 TB/s. scripts/gpu_check.sh runs it;
// bench/cuda_torch_peer.py gives PyTorch's figures on the same shapes.
//
//   cuda_kernels_bench            # prints one table
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "engine/cuda/matmul.h"
#include "engine/cuda/paged_attention.h"
#include "engine/cuda/weight_type.h"

namespace tandem::cuda {
namespace {

#define BENCH_CUDA(expr)                                                         \
  do {                                                                           \
    if (cudaError_t e_ = (expr); e_ != cudaSuccess) {                            \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr,         \
                   cudaGetErrorString(e_));                                      \
      std::exit(1);                                                              \
    }                                                                            \
  } while (false)

// Fills `n` bytes with a pattern whose 16-bit words are halves in [0.5, 1) (valid scales, small
// finite weights).
__global__ void FillKernel(uint16_t* p, size_t words, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < words;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    p[i] = static_cast<uint16_t>(0x3800u | (h & 0x03ffu));  // 0.5 .. 1 in half
  }
}

void* DeviceRandom(size_t bytes, uint32_t seed) {
  void* p = nullptr;
  BENCH_CUDA(cudaMalloc(&p, bytes + 16));
  FillKernel<<<1024, 256>>>(static_cast<uint16_t*>(p), (bytes + 16) / 2, seed);
  BENCH_CUDA(cudaGetLastError());
  return p;
}

// Median milliseconds of `run` over 20 timed calls after 3 warm-up ones.
double MedianMs(const std::function<void()>& run) {
  for (int i = 0; i < 3; ++i) run();
  BENCH_CUDA(cudaDeviceSynchronize());
  cudaEvent_t start, stop;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&stop));
  std::vector<float> ms;
  for (int i = 0; i < 20; ++i) {
    BENCH_CUDA(cudaEventRecord(start));
    run();
    BENCH_CUDA(cudaEventRecord(stop));
    BENCH_CUDA(cudaEventSynchronize(stop));
    float t = 0;
    BENCH_CUDA(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

const char* Name(WeightType t) {
  switch (t) {
    case WeightType::kF32: return "F32";
    case WeightType::kF16: return "F16";
    case WeightType::kBF16: return "BF16";
    case WeightType::kQ8_0: return "Q8_0";
    case WeightType::kQ4_0: return "Q4_0";
    case WeightType::kQ4_1: return "Q4_1";
  }
  return "?";
}

struct Shape {
  const char* name;
  int64_t n, k;
};

// An 8B Llama-3 layer's products (n outputs, k inputs).
constexpr Shape kLayer[] = {{"q", 4096, 4096},     {"k", 1024, 4096},    {"v", 1024, 4096},
                            {"o", 4096, 4096},     {"gate", 14336, 4096}, {"up", 14336, 4096},
                            {"down", 4096, 14336}};

void Run() {
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("GPU: %s, sm_%d%d, %d SMs, %.1f GiB\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, static_cast<double>(prop.totalGlobalMem) / (1 << 30));

  // The copy ceiling: 2 GiB device to device (read + write counted).
  const size_t copy_bytes = size_t{2} << 30;
  void* a = DeviceRandom(copy_bytes, 1);
  void* b = nullptr;
  BENCH_CUDA(cudaMalloc(&b, copy_bytes));
  const double copy_ms =
      MedianMs([&] { BENCH_CUDA(cudaMemcpyAsync(b, a, copy_bytes, cudaMemcpyDeviceToDevice)); });
  const double copy_gbs = 2.0 * static_cast<double>(copy_bytes) / (copy_ms * 1e-3) / 1e9;
  cudaFree(a);
  cudaFree(b);
  std::printf("copy bandwidth (read + write): %.0f GB/s; datasheet (H200): 4800 GB/s\n\n",
              copy_gbs);

  MatMulContext context;
  BENCH_CUDA(CreateMatMulContext(&context));
  const size_t workspace_bytes = MatMulWorkspaceBytes(512, 14336);
  BENCH_CUDA(cudaMalloc(&context.workspace, workspace_bytes));
  context.workspace_bytes = workspace_bytes;

  std::printf("| weights | product | m | path | ms | GB/s of W | TFLOP/s |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (WeightType type : {WeightType::kF16, WeightType::kBF16, WeightType::kQ8_0,
                          WeightType::kQ4_0, WeightType::kQ4_1}) {
    double layer_bytes = 0, layer_ms = 0;
    for (const Shape& s : kLayer) {
      const int64_t row_bytes = WeightRowBytes(type, s.k);
      const size_t w_bytes = static_cast<size_t>(row_bytes * s.n);
      void* w = DeviceRandom(w_bytes, 7);
      for (int64_t m : {int64_t{1}, int64_t{64}, int64_t{512}}) {
        float* x = static_cast<float*>(DeviceRandom(static_cast<size_t>(m * s.k) * 4, 3));
        float* y = nullptr;
        BENCH_CUDA(cudaMalloc(&y, static_cast<size_t>(m * s.n) * 4));
        // Activations as halves in [0.5, 1) read as floats are tiny but finite: fine for timing.
        MatMulParams p{.x = x, .x_stride = s.k, .w = w, .w_type = type, .w_row_bytes = 0,
                       .y = y, .y_stride = s.n, .m = m, .n = s.n, .k = s.k};
        const MatMulPath path = SelectMatMulPath(p, context);
        const double ms = MedianMs([&] { BENCH_CUDA(MatMul(p, context, 0)); });
        const double gbs = static_cast<double>(w_bytes) / (ms * 1e-3) / 1e9;
        const double tflops = 2.0 * static_cast<double>(m * s.n * s.k) / (ms * 1e-3) / 1e12;
        std::printf("| %s | %s %lldx%lld | %lld | %s | %.4f | %.0f | %.1f |\n", Name(type), s.name,
                    static_cast<long long>(s.n), static_cast<long long>(s.k),
                    static_cast<long long>(m),
                    path == MatMulPath::kGemv ? "gemv" : path == MatMulPath::kCublas ? "cublas"
                                                                                     : "tiled",
                    ms, gbs, tflops);
        if (m == 1) {
          layer_bytes += static_cast<double>(w_bytes);
          layer_ms += ms;
        }
        cudaFree(x);
        cudaFree(y);
      }
      cudaFree(w);
    }
    std::printf("| %s | a whole layer, decode token | 1 | gemv | %.4f | **%.0f** (%.0f%% of copy, "
                "%.0f%% of 4.8 TB/s) | |\n",
                Name(type), layer_ms, layer_bytes / (layer_ms * 1e-3) / 1e9,
                100.0 * layer_bytes / (layer_ms * 1e-3) / 1e9 / copy_gbs,
                100.0 * layer_bytes / (layer_ms * 1e-3) / 4.8e12);
  }
  DestroyMatMulContext(&context);
  cudaFree(context.workspace);

  // Paged attention, decode: 64 sequences of 2048 positions, F16 KV, blocks of 16.
  const int64_t seqs = 64, ctx = 2048, heads = 32, kv_heads = 8, dim = 128, bs = 16;
  const int64_t blocks_per_seq = ctx / bs, num_blocks = seqs * blocks_per_seq;
  const int64_t block_stride = 2 * bs * kv_heads * dim;  // one layer: K then V
  const size_t cache_bytes = static_cast<size_t>(num_blocks * block_stride) * 2;
  void* cache = DeviceRandom(cache_bytes, 11);
  std::vector<int32_t> tables(static_cast<size_t>(num_blocks)), seq(seqs), pos(seqs);
  for (int64_t i = 0; i < num_blocks; ++i) tables[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  for (int64_t s = 0; s < seqs; ++s) {
    seq[static_cast<size_t>(s)] = static_cast<int32_t>(s);
    pos[static_cast<size_t>(s)] = static_cast<int32_t>(ctx - 1);
  }
  int32_t *d_tables = nullptr, *d_seq = nullptr, *d_pos = nullptr;
  BENCH_CUDA(cudaMalloc(&d_tables, tables.size() * 4));
  BENCH_CUDA(cudaMalloc(&d_seq, seq.size() * 4));
  BENCH_CUDA(cudaMalloc(&d_pos, pos.size() * 4));
  BENCH_CUDA(cudaMemcpy(d_tables, tables.data(), tables.size() * 4, cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMemcpy(d_seq, seq.data(), seq.size() * 4, cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMemcpy(d_pos, pos.data(), pos.size() * 4, cudaMemcpyHostToDevice));
  float* q = static_cast<float*>(DeviceRandom(static_cast<size_t>(seqs * heads * dim) * 4, 5));
  float* out = nullptr;
  BENCH_CUDA(cudaMalloc(&out, static_cast<size_t>(seqs * heads * dim) * 4));
  AttentionPlan plan;
  BENCH_CUDA(PlanAttention({.token_seq = seq.data(), .token_pos = pos.data(), .num_tokens = seqs,
                            .num_heads = heads, .num_kv_heads = kv_heads, .head_dim = dim},
                           {.num_sms = prop.multiProcessorCount}, &plan));
  void* workspace = nullptr;
  BENCH_CUDA(cudaMalloc(&workspace, std::max<size_t>(plan.workspace_bytes, 256)));
  BENCH_CUDA(UploadAttentionPlan(plan, workspace, std::max<size_t>(plan.workspace_bytes, 256), 0));
  PagedAttentionParams ap;
  ap.q = q;
  ap.q_token_stride = heads * dim;
  ap.out = out;
  ap.out_token_stride = heads * dim;
  ap.k_cache = cache;
  ap.v_cache = static_cast<const uint16_t*>(cache) + bs * kv_heads * dim;
  ap.kv_type = KvCacheType::kF16;
  ap.block_stride = block_stride;
  ap.token_stride = kv_heads * dim;
  ap.kv_head_stride = dim;
  ap.block_size = bs;
  ap.block_tables = d_tables;
  ap.max_blocks_per_seq = blocks_per_seq;
  ap.token_seq = d_seq;
  ap.token_pos = d_pos;
  ap.num_tokens = seqs;
  ap.num_heads = heads;
  ap.num_kv_heads = kv_heads;
  ap.head_dim = dim;
  const double att_ms = MedianMs([&] {
    BENCH_CUDA(PagedAttention(ap, plan, workspace, std::max<size_t>(plan.workspace_bytes, 256), 0));
  });
  std::printf("\npaged attention decode, %lld sequences x %lld positions, %lld/%lld heads of %lld, "
              "F16 KV: %.4f ms, %.0f GB/s of KV (split into chunks of %lld)\n",
              static_cast<long long>(seqs), static_cast<long long>(ctx),
              static_cast<long long>(heads), static_cast<long long>(kv_heads),
              static_cast<long long>(dim), att_ms,
              static_cast<double>(cache_bytes) / (att_ms * 1e-3) / 1e9,
              static_cast<long long>(plan.kv_chunk));
  cudaFree(cache);
  cudaFree(d_tables);
  cudaFree(d_seq);
  cudaFree(d_pos);
  cudaFree(q);
  cudaFree(out);
  cudaFree(workspace);
}

}  // namespace
}  // namespace tandem::cuda

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no GPU: the CUDA kernel benchmark needs one\n");
    return 77;
  }
  tandem::cuda::Run();
  return 0;
}
