"""`tandem profile --roofline` / `python -m tandem_bench.profile`: a worker profile (profile.json,
docs/sim.md "Profiles") from hardware figures and a model's shape, for hardware not at hand.

The step model is the router's (router/placement/cost_model.h, StepProfile):

  step seconds = base + prefill_token * prompt tokens + decode_token * decoding sequences
               + context_token * decode context + prompt_context_token * prompt context

and the roofline fills it in from peak figures derated by an efficiency:

  base                  weight bytes / (bandwidth * mbu) + launch overhead
                        (every step reads the weights once)
  prefill_token         2 * matmul params / (flops * mfu)
  decode_token          2 * matmul params / (flops * mfu)   (a decoding sequence's token goes
                        through the same matrices; at small batches base dominates)
  context_token         KV bytes per token / (bandwidth * mbu)
                        (a decode token reads its whole context's K and V)
  prompt_context_token  4 * layers * heads * head_dim / (flops * mfu)
                        (Q K^T and P V: 2 multiply-adds per head dimension per (query, key) pair)

`tandem profile --worker=HOST:PORT` (capture from a running worker) is C++ (cli/profile.cc); the
`tandem` binary hands --roofline here.
"""
import argparse
import json
import math
import pathlib
import struct
import sys

from . import argtypes

FORMAT = "tandem-profile-v1"

# Dense (no sparsity) tensor throughput in the model's 16-bit type and memory bandwidth, from the
# vendor's public spec sheets (docs/sim.md cites them). FLOP/s, bytes/s, bytes of memory.
GPUS = {
    # https://www.nvidia.com/en-us/data-center/h100/ (H100 SXM: BF16 1,979 TFLOPS with sparsity,
    # so 989.5 dense; 3.35 TB/s; 80 GB)
    "h100": {"flops": 989.5e12, "mem_bw": 3.35e12, "mem_bytes": 80e9},
    # https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM: the same Hopper die and BF16 1,979
    # TFLOPS with sparsity; 4.8 TB/s; 141 GB)
    "h200": {"flops": 989.5e12, "mem_bw": 4.8e12, "mem_bytes": 141e9},
    # https://www.nvidia.com/en-us/data-center/a100/ (A100 80GB SXM: BF16 312 TFLOPS dense;
    # 2,039 GB/s)
    "a100": {"flops": 312e12, "mem_bw": 2.039e12, "mem_bytes": 80e9},
}

DTYPE_BYTES = {"f32": 4, "fp32": 4, "f16": 2, "fp16": 2, "bf16": 2, "fp8": 1, "f8": 1, "int8": 1,
               "q8": 1, "int4": 0.5, "q4": 0.5}


class ProfileError(ValueError):
    """A model or a set of figures that no profile can be made from; the message names it."""


# ------------------------------------------------------------------------------------------------
# The model's shape.
# ------------------------------------------------------------------------------------------------


def _field(reader, key):
    field = reader.fields.get(key)
    if field is None or not field.data:
        return None
    value = field.parts[field.data[0]]
    if field.types and field.types[0].name == "STRING":
        return bytes(value).decode("utf-8")
    return value.tolist()[0]


def shape_from_gguf(path):
    """{params, matmul_params, weight_bytes, layers, hidden, heads, kv_heads, head_dim, name} of
    a GGUF file: the weights as stored (quantized bytes), the shape from its metadata."""
    from gguf import GGUFReader  # PyPI gguf, scripts/requirements.txt
    try:
        reader = GGUFReader(str(path))
    except (OSError, ValueError) as error:
        raise ProfileError(f"cannot read '{path}' as GGUF: {error}") from None
    arch = _field(reader, "general.architecture")
    if not arch:
        raise ProfileError(f"'{path}': no general.architecture")

    def need(key):
        value = _field(reader, f"{arch}.{key}")
        if value is None:
            raise ProfileError(f"'{path}': no {arch}.{key}")
        return int(value)

    hidden, heads = need("embedding_length"), need("attention.head_count")
    kv_heads = _field(reader, f"{arch}.attention.head_count_kv") or heads
    head_dim = _field(reader, f"{arch}.attention.key_length") or hidden // heads
    params = sum(int(t.n_elements) for t in reader.tensors)
    names = {t.name: t for t in reader.tensors}
    embedding = int(names["token_embd.weight"].n_elements) if "token_embd.weight" in names else 0
    # The embedding is a lookup, not a product, unless the output head reuses it (tied).
    matmul = params - (embedding if "output.weight" in names else 0)
    return {"name": _field(reader, "general.name") or pathlib.Path(path).stem,
            "params": params, "matmul_params": matmul,
            "weight_bytes": sum(int(t.n_bytes) for t in reader.tensors),
            "layers": need("block_count"), "hidden": hidden, "heads": heads,
            "kv_heads": int(kv_heads), "head_dim": int(head_dim)}


_SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
                      "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def shape_from_hf(folder):
    """The same from a Hugging Face folder: config.json and the *.safetensors headers (an 8-byte
    little-endian length, then a JSON header of dtype, shape, data offsets per tensor)."""
    folder = pathlib.Path(folder)
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ProfileError(f"'{folder}/config.json': {error}") from None
    config = config.get("text_config", config)
    tensors = {}
    for file in sorted(folder.glob("*.safetensors")):
        with open(file, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        for name, info in header.items():
            if name != "__metadata__":
                tensors[name] = info
    if not tensors:
        raise ProfileError(f"'{folder}': no *.safetensors weights")
    params = weight_bytes = 0
    for info in tensors.values():
        params += math.prod(info["shape"])
        weight_bytes += info["data_offsets"][1] - info["data_offsets"][0]
    embedding = next((math.prod(i["shape"]) for n, i in tensors.items()
                      if n.endswith("embed_tokens.weight")), 0)
    tied = not any(n.endswith("lm_head.weight") for n in tensors)
    try:
        hidden, heads = config["hidden_size"], config["num_attention_heads"]
        layers = config["num_hidden_layers"]
    except KeyError as error:
        raise ProfileError(f"'{folder}/config.json': no {error}") from None
    return {"name": folder.name, "params": params,
            "matmul_params": params - (0 if tied else embedding), "weight_bytes": weight_bytes,
            "layers": layers, "hidden": hidden, "heads": heads,
            "kv_heads": config.get("num_key_value_heads") or heads,
            "head_dim": config.get("head_dim") or hidden // heads}


def shape_from_flags(args):
    missing = [f"--{n}" for n in ("params", "layers", "hidden", "kv_heads", "head_dim")
               if getattr(args, n) is None]
    if missing:
        raise ProfileError("without --model, give the model's shape: " + ", ".join(missing))
    if args.dtype not in DTYPE_BYTES:
        raise ProfileError(f"--dtype '{args.dtype}' is not one of {', '.join(DTYPE_BYTES)}")
    heads = args.heads or args.hidden // args.head_dim
    return {"name": args.name or f"{args.params:.3g} params", "params": args.params,
            "matmul_params": args.params, "weight_bytes": args.params * DTYPE_BYTES[args.dtype],
            "layers": args.layers, "hidden": args.hidden, "heads": heads,
            "kv_heads": args.kv_heads, "head_dim": args.head_dim}


# ------------------------------------------------------------------------------------------------
# The roofline.
# ------------------------------------------------------------------------------------------------


def roofline(shape, flops, mem_bw, mfu, mbu, launch_overhead_s, kv_dtype_bytes):
    """The step coefficients (seconds) and the KV bytes per token; formulas in the module
    docstring and docs/sim.md."""
    compute = flops * mfu
    bandwidth = mem_bw * mbu
    kv_bytes_per_token = 2 * shape["layers"] * shape["kv_heads"] * shape["head_dim"] * kv_dtype_bytes
    step = {
        "base_seconds": shape["weight_bytes"] / bandwidth + launch_overhead_s,
        "prefill_token_seconds": 2 * shape["matmul_params"] / compute,
        "decode_token_seconds": 2 * shape["matmul_params"] / compute,
        "context_token_seconds": kv_bytes_per_token / bandwidth,
        "prompt_context_token_seconds": 4 * shape["layers"] * shape["heads"] * shape["head_dim"]
                                        / compute,
    }
    return step, kv_bytes_per_token


def _flag(p, name, **kwargs):
    p.add_argument(f"--{name}", *([f"--{name.replace('_', '-')}"] if "_" in name else []),
                   **kwargs)


_positive = argtypes.number(float, lambda value: 0 < value < math.inf, "a positive number")


def build_parser():
    p = argparse.ArgumentParser(
        prog="tandem profile",
        description="Writes a worker profile (profile.json) from hardware figures and a model's "
                    "shape: the router's step model with roofline coefficients (docs/sim.md).")
    p.add_argument("--roofline", action="store_true", required=True,
                   help="make the profile from figures (needed: `tandem profile` without it "
                        "captures a running worker's)")
    _flag(p, "out", type=pathlib.Path, required=True, metavar="FILE", help="profile.json to write")
    g = p.add_argument_group("hardware (a --gpu preset, or both figures; figures beat the preset)")
    _flag(g, "gpu", choices=sorted(GPUS), help="figures from the vendor's spec sheet")
    _flag(g, "flops", type=_positive, help="dense 16-bit tensor FLOP/s (e.g. 989.5e12)")
    _flag(g, "mem_bw_gbps", type=_positive, metavar="GB/S", help="memory bandwidth, GB/s")
    _flag(g, "mem_gb", type=_positive, metavar="GB",
          help="memory for weights and KV (for kv_blocks; default: the preset's)")
    _flag(g, "mfu", type=argtypes.ratio, default=0.5,
          help="share of peak FLOP/s reached by matrix products (default 0.5)")
    _flag(g, "mbu", type=argtypes.ratio, default=0.8,
          help="share of peak bandwidth reached by weight and KV reads (default 0.8)")
    _flag(g, "launch_overhead_us", type=float, default=0.0, metavar="US",
          help="fixed cost per step beyond the weight read (launches, sampling; default 0)")
    g = p.add_argument_group("model (a --model file/folder, or its shape)")
    _flag(g, "model", type=pathlib.Path, help="a GGUF file or a Hugging Face folder")
    _flag(g, "name", help="the model's name in the profile")
    _flag(g, "params", type=_positive, help="parameters (all of them multiply each token)")
    for name, what in (("layers", "transformer layers"), ("hidden", "hidden size"),
                       ("heads", "query heads (default hidden / head_dim)"),
                       ("kv_heads", "key/value heads"), ("head_dim", "size of one head")):
        _flag(g, name, type=int, help=what)
    _flag(g, "dtype", default="bf16", help="weight type with --params (default bf16)")
    _flag(g, "kv_dtype", default="bf16", help="KV cache element type (default bf16)")
    g = p.add_argument_group("worker settings written into the profile")
    _flag(g, "block_size", type=int, default=16, help="tokens per KV block (default 16)")
    _flag(g, "kv_blocks", type=int,
          help="KV blocks (default: what --mem_gb holds after the weights, at --mem_util)")
    _flag(g, "mem_util", type=argtypes.ratio, default=0.9,
          help="share of memory weights and KV may take (default 0.9)")
    _flag(g, "max_running", type=int, default=256, help="most sequences at once (default 256)")
    _flag(g, "token_budget", type=int, default=2048, help="most tokens per step (default 2048)")
    return p


def make_profile(args):
    """profile.json (a dict) for the parsed flags; ProfileError names what is wrong."""
    preset = GPUS.get(args.gpu) if args.gpu else {}
    flops = args.flops or preset.get("flops")
    mem_bw = args.mem_bw_gbps * 1e9 if args.mem_bw_gbps else preset.get("mem_bw")
    if flops is None or mem_bw is None:
        raise ProfileError("give --gpu (one of " + ", ".join(sorted(GPUS)) + ") or both --flops "
                           "and --mem_bw_gbps")
    if args.kv_dtype not in DTYPE_BYTES:
        raise ProfileError(f"--kv_dtype '{args.kv_dtype}' is not one of {', '.join(DTYPE_BYTES)}")
    if args.model is not None:
        shape_flags = [n for n in ("params", "layers", "hidden", "heads", "kv_heads", "head_dim")
                       if getattr(args, n) is not None]
        if shape_flags:
            raise ProfileError(f"--model gives the shape; leave out --{shape_flags[0]}")
        if args.model.is_dir():
            shape = shape_from_hf(args.model)
        elif args.model.is_file():
            shape = shape_from_gguf(args.model)
        else:
            raise ProfileError(f"--model '{args.model}' does not exist")
    else:
        shape = shape_from_flags(args)
    for key in ("layers", "hidden", "heads", "kv_heads", "head_dim"):
        if not shape[key] or shape[key] < 1:
            raise ProfileError(f"the model's {key} must be >= 1, not {shape[key]}")
    step, kv_bytes = roofline(shape, flops, mem_bw, args.mfu, args.mbu,
                              args.launch_overhead_us * 1e-6, DTYPE_BYTES[args.kv_dtype])
    kv_blocks = args.kv_blocks
    mem_bytes = args.mem_gb * 1e9 if args.mem_gb else preset.get("mem_bytes")
    if kv_blocks is None:
        if mem_bytes is None:
            raise ProfileError("give --kv_blocks, or --mem_gb (or a --gpu) to derive it")
        kv_blocks = math.floor((mem_bytes * args.mem_util - shape["weight_bytes"])
                               / (kv_bytes * args.block_size))
        if kv_blocks < 1:
            raise ProfileError(f"the weights ({shape['weight_bytes'] / 1e9:.1f} GB) leave no room "
                               f"for KV in {mem_bytes / 1e9:.0f} GB at --mem_util {args.mem_util}")
    for name in ("block_size", "max_running", "token_budget", "kv_blocks"):
        value = kv_blocks if name == "kv_blocks" else getattr(args, name)
        if value < 1:
            raise ProfileError(f"--{name} must be >= 1")
    return {
        "format": FORMAT, "model": shape["name"], "engine": f"roofline-{args.gpu or 'custom'}",
        "source": "roofline", "step": step, "kv_bytes_per_token": kv_bytes,
        "block_size": args.block_size, "kv_blocks": kv_blocks, "max_running": args.max_running,
        "token_budget": args.token_budget,
        "notes": (f"roofline (docs/sim.md, \"Roofline profiles\"): {flops / 1e12:g} TFLOP/s x "
                  f"mfu {args.mfu:g}, {mem_bw / 1e9:g} GB/s x mbu {args.mbu:g}, launch "
                  f"{args.launch_overhead_us:g} us; {shape['weight_bytes'] / 1e9:.4g} GB of "
                  f"weights, {shape['matmul_params']:.4g} matmul params, {shape['layers']} layers, "
                  f"{shape['heads']} heads / {shape['kv_heads']} KV heads of {shape['head_dim']}, "
                  f"KV {args.kv_dtype}; measure a real worker with `tandem profile --worker` "
                  "when you have one"),
    }


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        profile = make_profile(args)
    except ProfileError as error:
        parser.error(str(error))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(profile, indent=1) + "\n")
    s = profile["step"]
    print(f"{args.out}: {profile['model']} on {profile['engine']}: step = "
          f"{s['base_seconds'] * 1e3:.3g} ms + {s['prefill_token_seconds'] * 1e6:.3g} us/prompt "
          f"token + {s['decode_token_seconds'] * 1e6:.3g} us/decoding sequence + "
          f"{s['context_token_seconds'] * 1e9:.3g} ns/decode context token + "
          f"{s['prompt_context_token_seconds'] * 1e9:.3g} ns/prompt context token; "
          f"{profile['kv_blocks']} KV blocks of {profile['block_size']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
