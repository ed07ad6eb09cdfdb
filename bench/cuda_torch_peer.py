"""PyTorch's figures on the shapes engine/cuda/kernels_bench.cu measures, in the same run of
scripts/gpu_check.sh: torch.matmul of F16 / BF16 weights for one decode token, a decode batch of 64
and a prefill of 512 tokens over an 8B Llama-3 layer's products, and
torch.nn.functional.scaled_dot_product_attention for decode over 64 contiguous 2048-token contexts
(a dense layout: what a paged kernel is measured against). Medians of 20 timed runs after 3
warm-up runs, with CUDA events. Needs a GPU and PyTorch with CUDA (the GPU machine has both).

    python3 bench/cuda_torch_peer.py
"""

import statistics
import sys

LAYER = [("q", 4096, 4096), ("k", 1024, 4096), ("v", 1024, 4096), ("o", 4096, 4096),
         ("gate", 14336, 4096), ("up", 14336, 4096), ("down", 4096, 14336)]


def median_ms(torch, run):
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def main():
    try:
        import torch
    except ImportError:
        print("no PyTorch: the peer figures need it")
        return 77
    if not torch.cuda.is_available():
        print("no GPU: the peer figures need one")
        return 77
    print(f"PyTorch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    print("| weights | product | m | ms | GB/s of W | TFLOP/s |")
    print("|---|---|---|---|---|---|")
    for dtype, name in ((torch.float16, "F16"), (torch.bfloat16, "BF16")):
        layer_bytes = layer_ms = 0.0
        for label, n, k in LAYER:
            w = torch.rand(n, k, device="cuda", dtype=dtype)
            for m in (1, 64, 512):
                x = torch.rand(m, k, device="cuda", dtype=dtype)
                ms = median_ms(torch, lambda: torch.matmul(x, w.t()))
                w_bytes = w.numel() * w.element_size()
                print(f"| {name} | {label} {n}x{k} | {m} | {ms:.4f} | "
                      f"{w_bytes / (ms * 1e-3) / 1e9:.0f} | {2 * m * n * k / (ms * 1e-3) / 1e12:.1f} |")
                if m == 1:
                    layer_bytes += w_bytes
                    layer_ms += ms
            del w
        print(f"| {name} | a whole layer, decode token | 1 | {layer_ms:.4f} | "
              f"**{layer_bytes / (layer_ms * 1e-3) / 1e9:.0f}** | |")

    seqs, ctx, heads, kv_heads, dim = 64, 2048, 32, 8, 128
    q = torch.rand(seqs, heads, 1, dim, device="cuda", dtype=torch.float16)
    k = torch.rand(seqs, kv_heads, ctx, dim, device="cuda", dtype=torch.float16)
    v = torch.rand(seqs, kv_heads, ctx, dim, device="cuda", dtype=torch.float16)
    # GQA: each KV head serves heads / kv_heads query heads.
    k = k.repeat_interleave(heads // kv_heads, dim=1)
    v = v.repeat_interleave(heads // kv_heads, dim=1)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    ms = median_ms(torch, lambda: sdpa(q, k, v))
    kv_bytes = 2 * seqs * kv_heads * ctx * dim * 2  # what a GQA-aware kernel must read
    print(f"\nsdpa decode, {seqs} sequences x {ctx} positions, {heads}/{kv_heads} heads of {dim}, "
          f"F16: {ms:.4f} ms, {kv_bytes / (ms * 1e-3) / 1e9:.0f} GB/s of (unrepeated) KV")
    return 0


if __name__ == "__main__":
    sys.exit(main())
