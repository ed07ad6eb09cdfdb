"""Random-weight GGUF models of real Llama shapes, for measuring memory and speed at real sizes.

  .venv/bin/python bench/make_shape_models.py [--out /work/bigmodels] [--shapes 1b,8b]
                                              [--types Q4_1+Q8_0emb,Q4_K_M,...]

Shapes (tied embeddings at 1B, an untied output at 8B, as the released models have):
  1b  Llama 3.2 1B: hidden 2048, 16 layers, 32 / 8 heads, head_dim 64, ffn 8192, vocab 128256
  8b  Llama 3.1 8B: hidden 4096, 32 layers, 32 / 8 heads, head_dim 128, ffn 14336, vocab 128256

For each shape a Q8_0 base file (<shape>.Q8_0.gguf) is written directly (random int8 codes and f16
scales, streamed tensor by tensor, so an 8B file never sits in memory); every other type is made
from it by llama.cpp's own quantizer (llama_model_quantize through llama-cpp-python, as
llama-quantize does, with allow_requantize), so the files hold what a user's llama-quantize run
would write for that type, K-quant mixes included. "Q4_1+Q8_0emb" is Q4_1 with Q8_0 token
embeddings (llama-quantize --token-embedding-type q8_0). "IQ4_NL-pure" is written directly like
the base, every matrix IQ4_NL (as llama-quantize --pure writes it): llama.cpp's IQ4_NL quantizer
searches each block's scale and would take about an hour for the 8B shape on 2 cores. A file that
exists is kept.

The tokenizer is the default model's (SmolLM2's BPE vocabulary) padded with control tokens to
128256 entries, so that the embedding and output matrices have Llama 3's vocabulary size.
The weights are random: the files are for memory and speed, not for text.
"""
import argparse
import ctypes
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
import llama_cpp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
VOCAB = 128256


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    tied: bool
    context: int = 131072
    rope_theta: float = 500000.0


SHAPES = {
    "1b": Shape(hidden=2048, layers=16, heads=32, kv_heads=8, head_dim=64, ffn=8192, tied=True),
    "8b": Shape(hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, ffn=14336, tied=False),
}

# Name -> (llama_ftype, token embedding ggml type or None).
GGML_TYPE_Q8_0 = 8
TYPES = {
    "Q4_1+Q8_0emb": (llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_1, GGML_TYPE_Q8_0),
    "Q4_0": (llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0, None),
    "Q4_1": (llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_1, None),
    "Q5_0": (llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_0, None),
    "Q5_1": (llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_1, None),
    "Q4_K_M": (llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M, None),
    "Q5_K_M": (llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_K_M, None),
    "Q6_K": (llama_cpp.LLAMA_FTYPE_MOSTLY_Q6_K, None),
    "IQ4_NL": (llama_cpp.LLAMA_FTYPE_MOSTLY_IQ4_NL, None),
    "F16": (llama_cpp.LLAMA_FTYPE_MOSTLY_F16, None),
    "BF16": (llama_cpp.LLAMA_FTYPE_MOSTLY_BF16, None),
}

TOKENIZER_KEYS = [
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token",
]
TOKEN_TYPE_CONTROL = 3


def tokenizer_metadata():
    """The default model's tokenizer keys, the vocabulary padded to VOCAB with control tokens."""
    reader = gguf.GGUFReader(DEFAULT_MODEL)
    out = []
    for key in TOKENIZER_KEYS:
        field = reader.get_field(key)
        if field is None:
            continue
        value = field.contents()
        if key == "tokenizer.ggml.tokens":
            value = value + [f"<|reserved_{i}|>" for i in range(VOCAB - len(value))]
        elif key == "tokenizer.ggml.token_type":
            value = value + [TOKEN_TYPE_CONTROL] * (VOCAB - len(value))
        sub_type = field.types[1] if len(field.types) > 1 else None
        out.append((key, value, field.types[0], sub_type))
    return out


def tensors(shape):
    """(GGUF name, [rows, cols] or [n], gain) in file order; gain: the weights' standard deviation
    times sqrt(cols), None for a norm."""
    out = [("token_embd.weight", [VOCAB, shape.hidden], 1.0 * np.sqrt(shape.hidden))]
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    for l in range(shape.layers):
        out += [
            (f"blk.{l}.attn_norm.weight", [shape.hidden], None),
            (f"blk.{l}.attn_q.weight", [q, shape.hidden], 1.0),
            (f"blk.{l}.attn_k.weight", [kv, shape.hidden], 1.0),
            (f"blk.{l}.attn_v.weight", [kv, shape.hidden], 1.0),
            (f"blk.{l}.attn_output.weight", [shape.hidden, q], 0.5),
            (f"blk.{l}.ffn_norm.weight", [shape.hidden], None),
            (f"blk.{l}.ffn_gate.weight", [shape.ffn, shape.hidden], 1.0),
            (f"blk.{l}.ffn_up.weight", [shape.ffn, shape.hidden], 1.0),
            (f"blk.{l}.ffn_down.weight", [shape.hidden, shape.ffn], 0.5),
        ]
    out.append(("output_norm.weight", [shape.hidden], None))
    if not shape.tied:
        out.append(("output.weight", [VOCAB, shape.hidden], 4.0))
    return out


def q8_0_rows(rng, rows, cols, std):
    """Q8_0 bytes of a [rows, cols] matrix of uniform random codes scaled to `std`."""
    blocks = rows * cols // 32
    data = np.empty((blocks, 34), dtype=np.uint8)
    codes_std = np.sqrt((127 * 128) / 3.0)  # uniform on -127..127
    # Per-block scales vary by up to 2x around the mean, as trained weights' do.
    d = (std / codes_std) * rng.uniform(0.5, 1.5, size=blocks)
    data[:, :2] = d.astype(np.float16).view(np.uint8).reshape(blocks, 2)
    data[:, 2:] = rng.integers(-127, 128, size=(blocks, 32), dtype=np.int8).view(np.uint8)
    return data.reshape(rows, cols // 32 * 34)


def iq4_nl_rows(rng, rows, cols, std):
    """IQ4_NL bytes of a [rows, cols] matrix of uniform random 4-bit indices scaled to `std`
    (the codebook's values have a standard deviation of about 69 over uniform indices)."""
    blocks = rows * cols // 32
    data = np.empty((blocks, 18), dtype=np.uint8)
    d = (std / 69.0) * rng.uniform(0.5, 1.5, size=blocks)
    data[:, :2] = d.astype(np.float16).view(np.uint8).reshape(blocks, 2)
    data[:, 2:] = rng.integers(0, 256, size=(blocks, 16), dtype=np.uint8)
    return data.reshape(rows, cols // 32 * 18)


# Types written directly: name -> (llama_ftype, GGML type, bytes per 32 weights, row maker).
DIRECT = {
    "Q8_0": (llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, gguf.GGMLQuantizationType.Q8_0, 34, q8_0_rows),
    "IQ4_NL-pure": (llama_cpp.LLAMA_FTYPE_MOSTLY_IQ4_NL, gguf.GGMLQuantizationType.IQ4_NL, 18,
                    iq4_nl_rows),
}


def write_base(path, shape, seed=31, type_name="Q8_0"):
    """The file of `shape` with every matrix of a DIRECT type (the Q8_0 base by default),
    streamed one tensor at a time."""
    ftype, qtype, block_bytes, make_rows = DIRECT[type_name]
    rng = np.random.default_rng(seed)
    tmp = path.with_suffix(".tmp")
    writer = gguf.GGUFWriter(tmp, "llama")
    writer.add_block_count(shape.layers)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(VOCAB)
    writer.add_file_type(ftype)
    for key, value, vtype, sub_type in tokenizer_metadata():
        writer.add_key_value(key, value, vtype, sub_type=sub_type)
    plan = tensors(shape)
    for name, dims, gain in plan:
        if gain is None:
            writer.add_tensor_info(name, dims, np.dtype(np.float32), dims[0] * 4)
        else:
            byte_dims = [dims[0], dims[1] // 32 * block_bytes]
            writer.add_tensor_info(name, byte_dims, np.dtype(np.uint8),
                                   byte_dims[0] * byte_dims[1], raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, dims, gain in plan:
        if gain is None:
            writer.write_tensor_data(rng.uniform(0.8, 1.2, size=dims[0]).astype(np.float32))
        else:
            writer.write_tensor_data(make_rows(rng, dims[0], dims[1], gain / np.sqrt(dims[1])))
    writer.close()
    os.replace(tmp, path)


def quantize(src, dst, ftype, token_embedding_type):
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True
    params.nthread = os.cpu_count() or 2
    if token_embedding_type is not None:
        params.token_embedding_type = token_embedding_type
    tmp = dst.with_suffix(".tmp")
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
    if rc != 0:
        sys.exit(f"llama_model_quantize {src} -> {dst} returned {rc}")
    os.replace(tmp, dst)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="/work/bigmodels")
    parser.add_argument("--shapes", default="1b,8b")
    parser.add_argument("--types", default=",".join(TYPES))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for shape_name in args.shapes.split(","):
        shape = SHAPES[shape_name]
        base = out / f"llama-{shape_name}.Q8_0.gguf"
        if not base.exists():
            print(f"writing {base}", flush=True)
            write_base(base, shape)
        for type_name in args.types.split(","):
            if type_name == "Q8_0":
                continue
            dst = out / f"llama-{shape_name}.{type_name}.gguf"
            if dst.exists():
                continue
            if type_name in DIRECT:
                print(f"writing {dst}", flush=True)
                write_base(dst, shape, type_name=type_name)
                continue
            ftype, embedding_type = TYPES[type_name]
            print(f"quantizing {dst}", flush=True)
            quantize(base, dst, ftype, embedding_type)


if __name__ == "__main__":
    main()
