"""Tandem's CPU forward pass against llama.cpp on small random Llama-family models, one per
supported layout: GGUF with F32 / F16 / Q8_0 / Q4_1 matrices, for "llama" (also with Llama 3.1's
RoPE scaling), "qwen2" (Q/K/V biases), "qwen3" (per-head Q/K RMSNorm before RoPE) and "phi3" (fused
attn_qkv and gate/up matrices, split by Tandem into row ranges of the file), with and
without grouped-query attention, with tied and untied embeddings, and a head_dim
that is not hidden / heads; and the same shapes as Hugging Face directories (config.json and two
.safetensors shards, F32 or BF16; Phi-3's fused as Hugging Face stores them) run by Tandem against
llama.cpp on a GGUF of the same values.

Each model is generated here: random weights in Hugging Face's orientation and naming (a matrix is
[out, in], Q/K rows in NeoX "rotate half" order), written as GGUF the way llama.cpp's converter
does (for "llama" the Q/K rows are permuted for interleaved RoPE pairs). The tokenizer metadata is
copied from the default model (llama.cpp will not load a file without one), so the vocabulary has
49152 entries. The weights are scaled so that attention is far from uniform (scores with a
standard deviation of about 2) and logits are well spread (std about 8), so that a top-1 check
means something.

Tolerances, measured over 64 random tokens under teacher forcing (logits have a std of 8-12 and a
largest magnitude of 35-110):
  - F32 matrices: llama.cpp runs with an F32 KV cache, so both engines compute in float32 and
    differ only in summation order and the exp / SiLU approximations: max |dlogit| 2e-5..6e-5,
    at most 1.1e-6 of the largest |logit|. Required: max |dlogit| <= 1e-5 * (1 + max |logit|)
    and the same top-1 token wherever the reference's margin is at least 1e-3.
  - F16 matrices: llama.cpp rounds the activations to F16 before every F16 product (Tandem keeps
    them in float32): max |dlogit| 3e-2..4.5e-2, at most 8.3e-4 of the largest |logit|. Required:
    max |dlogit| <= 5e-3 * (1 + max |logit|) and the same top-1 wherever the margin is >= 0.1.
  - F32 matrices with an F16 KV cache on both sides (Tandem's default cache): llama.cpp also
    rounds Q and the softmax weights to F16 for its F16 products (Tandem widens the cache and keeps
    them in float32): max |dlogit| 2.0e-2..3.2e-2, at most 7.0e-4 of the largest |logit|; the F16
    requirement.
  - Safetensors F32 / BF16 (Tandem) against the F32 GGUF of the same values (llama.cpp): as F32,
    max |dlogit| 2.4e-5..5.5e-5, at most 1.0e-6 of the largest |logit|; same requirement. (With
    the Q/K permutation left out of the GGUF, i.e. the wrong RoPE pairing, max |dlogit| is ~60.)
  - Q8_0 / Q4_1 matrices: both engines quantize activations to 8 bits (llama.cpp rounds each
    block's scale to F16, Tandem keeps it in float32), and every flipped rounding changes a value
    by a quantization step; through a random network the two engines' quantization noise becomes
    nearly independent: mean |dlogit| 0.08..0.14, max 0.7..1.3 (each engine is as far from the
    exact product of the dequantized weights as from the other). The margin-aware criteria of
    forward_reference_test.py, with the near-tie margin scaled to this noise: mean |dlogit| < 0.25
    and the same top-1 at >= 99% of the positions where the reference's margin is >= 0.5 (every
    position agreed at that margin when measured; at 0.25, 1 in 64 did not).
Llama 3.1's RoPE scaling ("llama3_rope" shapes): llama.cpp reads it only as the `rope_freqs.weight`
divisors its converter writes; Tandem is run on that file, on the same values as a Hugging Face
directory whose config.json carries the "rope_scaling" (Tandem computes the divisors), and on a GGUF
that carries the scaling as `llama.rope.scaling.*` metadata. Same tolerances as above; with the
scaling left out on Tandem's side the F32 comparison is off by max |dlogit| 44, mean 4.2.
"""
import json
import struct
from dataclasses import dataclass, replace

import gguf
import llama_cpp
import numpy as np
import pytest

from reference_common import (DEFAULT_MODEL, GGML_TYPE_F16, GGML_TYPE_F32, compare, reference,
                              tandem)

NUM_TOKENS = 64


@dataclass(frozen=True)
class Shape:
    """The hyper-parameters of one random model."""
    name: str
    # "llama" | "qwen2" (Q/K/V biases) | "qwen3" (per-head Q/K RMSNorm) | "phi3" (fused
    # attn_qkv and gate/up matrices)
    arch: str
    hidden: int
    heads: int
    kv_heads: int
    tied: bool
    head_dim: int = 32
    ffn: int = 192
    layers: int = 2
    # Llama 3.1's RoPE scaling, as Hugging Face's config.json "rope_scaling" (rope_type "llama3");
    # written to GGUF as the `rope_freqs.weight` divisors llama.cpp's converter computes from it.
    llama3_rope: dict | None = None
    # Written as `{arch}.attention.sliding_window` when set.
    sliding_window: int | None = None

    @property
    def bias(self):
        return self.arch == "qwen2"

    @property
    def qk_norm(self):
        return self.arch == "qwen3"

    @property
    def rms_eps(self):
        return 1e-5 if self.arch in ("llama", "phi3") else 1e-6

    @property
    def rope_theta(self):
        if self.llama3_rope is not None:
            return 500000.0
        return 10000.0 if self.arch in ("llama", "phi3") else 1000000.0


SHAPES = [
    Shape("llama_gqa_tied", "llama", hidden=128, heads=4, kv_heads=2, tied=True),
    # head_dim 32 != hidden / heads = 16.
    Shape("llama_mha_untied", "llama", hidden=64, heads=4, kv_heads=4, tied=False, layers=3),
    Shape("qwen2_gqa_untied", "qwen2", hidden=128, heads=4, kv_heads=2, tied=False),
    Shape("qwen2_mha_tied", "qwen2", hidden=128, heads=4, kv_heads=4, tied=True),
    # Llama 3.1/3.2/3.3's scaling with a short original context, so that over NUM_TOKENS positions
    # most frequencies are divided by `factor` and one falls in the smoothed band (with the real
    # 8192 the scaled frequencies turn by < 0.05 rad in 64 positions and a test would not see
    # them).
    Shape("llama3_rope_gqa_tied", "llama", hidden=128, heads=4, kv_heads=2, tied=True,
          llama3_rope={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                       "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
    # Qwen3's layout: head_dim 64 (so attention runs the AVX tile kernels) != hidden / heads.
    Shape("qwen3_gqa_tied", "qwen3", hidden=128, heads=4, kv_heads=2, tied=True, head_dim=64),
    Shape("qwen3_mha_untied", "qwen3", hidden=64, heads=2, kv_heads=2, tied=False),
    # Phi-3-mini's layout: multi-head, untied, head_dim 96, and the sliding window its converter
    # writes (2047 there), which llama.cpp ignores for phi3 (and so does Tandem): a window of 16
    # over 64 tokens, if applied, changes the logits (F32: max |dlogit| 38, mean 3.2, top-1 39%).
    Shape("phi3_mha_untied", "phi3", hidden=192, heads=2, kv_heads=2, tied=False, head_dim=96,
          sliding_window=16),
    # Phi-3-medium's grouped-query attention.
    Shape("phi3_gqa_tied", "phi3", hidden=128, heads=4, kv_heads=2, tied=True),
]

# The architectures Tandem also loads as Hugging Face directories (all of them).
HF_SHAPES = SHAPES
HF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                    "qwen3": "Qwen3ForCausalLM", "phi3": "Phi3ForCausalLM"}

GGUF_TYPES = {
    "F32": gguf.GGMLQuantizationType.F32,
    "F16": gguf.GGMLQuantizationType.F16,
    "Q8_0": gguf.GGMLQuantizationType.Q8_0,
    "Q4_1": gguf.GGMLQuantizationType.Q4_1,
}

# Copied from the default model: what llama.cpp needs to build its vocabulary.
TOKENIZER_KEYS = [
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token",
]


@pytest.fixture(scope="module")
def tokenizer_metadata():
    """[(key, value, type, element type)] of TOKENIZER_KEYS in the default model."""
    reader = gguf.GGUFReader(DEFAULT_MODEL)
    out = []
    for key in TOKENIZER_KEYS:
        field = reader.get_field(key)
        assert field is not None, key
        sub_type = field.types[1] if len(field.types) > 1 else None
        out.append((key, field.contents(), field.types[0], sub_type))
    return out


def vocab_size(tokenizer_metadata):
    return next(len(v) for k, v, _, _ in tokenizer_metadata if k == "tokenizer.ggml.tokens")


def random_makers(rng):
    """(matrix(rows, cols, gain), norm(n, mean=1.0)): float32 random matrices whose rows map
    unit-RMS inputs to outputs of std `gain`, and norm weights spread 0.2 around `mean`."""
    def matrix(rows, cols, gain):
        return (rng.standard_normal((rows, cols)) * gain / np.sqrt(cols)).astype(np.float32)

    def norm(n, mean=1.0):
        return (mean + 0.2 * rng.standard_normal(n)).astype(np.float32)

    return matrix, norm


def random_weights(shape, vocab, seed):
    """Hugging Face names -> float32 arrays in PyTorch orientation ([out, in])."""
    rng = np.random.default_rng(seed)
    h, f = shape.hidden, shape.ffn
    dq, dkv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    matrix, norm = random_makers(rng)

    w = {"model.embed_tokens.weight": rng.standard_normal((vocab, h)).astype(np.float32)}
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(h)
        w[p + "self_attn.q_proj.weight"] = matrix(dq, h, 1.5)
        w[p + "self_attn.k_proj.weight"] = matrix(dkv, h, 1.5)
        w[p + "self_attn.v_proj.weight"] = matrix(dkv, h, 1.0)
        w[p + "self_attn.o_proj.weight"] = matrix(h, dq, 1.0)
        if shape.bias:
            for proj, n in (("q_proj", dq), ("k_proj", dkv), ("v_proj", dkv)):
                w[p + f"self_attn.{proj}.bias"] = (0.5 * rng.standard_normal(n)).astype(np.float32)
        if shape.qk_norm:
            # Normalized heads score with a std of about 1 * gain²: 1.5 gives about 2.
            w[p + "self_attn.q_norm.weight"] = norm(shape.head_dim, 1.5)
            w[p + "self_attn.k_norm.weight"] = norm(shape.head_dim, 1.5)
        w[p + "post_attention_layernorm.weight"] = norm(h)
        w[p + "mlp.gate_proj.weight"] = matrix(f, h, 1.0)
        w[p + "mlp.up_proj.weight"] = matrix(f, h, 1.0)
        w[p + "mlp.down_proj.weight"] = matrix(h, f, 1.0)
    w["model.norm.weight"] = norm(h)
    if not shape.tied:
        w["lm_head.weight"] = matrix(vocab, h, 8.0)
    return w


GGUF_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight",  # Phi-3
    "mlp.gate_up_proj.weight": "ffn_up.weight",  # Phi-3
}


def gguf_name(hf_name):
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
           "output_norm.weight", "lm_head.weight": "output.weight"}
    if hf_name in top:
        return top[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    return f"blk.{layer}.{GGUF_NAMES[rest]}"


def permute_for_interleaved_rope(w, n_head):
    """llama.cpp's converter (convert_hf_to_gguf.py, LlamaModel.permute): reorders each head's rows
    from NeoX pairs (i, i + d/2) to adjacent pairs (2i, 2i + 1)."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_freqs(shape):
    """The per-frequency divisors llama.cpp's converter writes as `rope_freqs.weight` for a
    "llama3" rope_scaling (conversion/llama.py, generate_extra_tensors): 1 for short wavelengths,
    `factor` for long ones, a smooth blend between."""
    r = shape.llama3_rope
    freqs = 1.0 / shape.rope_theta ** (np.arange(0, shape.head_dim, 2, dtype=np.float64)
                                       / shape.head_dim)
    old = r["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / r["low_freq_factor"], old / r["high_freq_factor"]
    out = []
    for freq in freqs:
        wavelen = 2 * np.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(r["factor"])
        else:
            smooth = (old / wavelen - r["low_freq_factor"]) / (r["high_freq_factor"] -
                                                               r["low_freq_factor"])
            out.append(1.0 / ((1 - smooth) / r["factor"] + smooth))
    return np.array(out, dtype=np.float32)


def fuse_for_phi3(weights):
    """Phi-3's fused matrices, as Hugging Face stores them (qkv_proj: the rows of Q, K, V;
    gate_up_proj: the rows of gate, then up) and llama.cpp's converter writes them (attn_qkv,
    ffn_up of twice the FFN rows)."""
    out = {}
    for name, w in weights.items():
        if name.endswith(("k_proj.weight", "v_proj.weight", "gate_proj.weight")):
            continue
        if name.endswith("q_proj.weight"):
            p = name[:-len("q_proj.weight")]
            w = np.concatenate([w, weights[p + "k_proj.weight"], weights[p + "v_proj.weight"]])
            name = p + "qkv_proj.weight"
        elif name.endswith("up_proj.weight"):
            p = name[:-len("up_proj.weight")]
            w = np.concatenate([weights[p + "gate_proj.weight"], w])
            name = p + "gate_up_proj.weight"
        out[name] = w
    return out


def shape_writer(path, arch, shape, context_length):
    """A GGUFWriter for `arch` with the shape keys every test model has: layers, context, hidden,
    ffn, heads, KV heads, key and value lengths."""
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(shape.layers)
    writer.add_context_length(context_length)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    return writer


def write_gguf(path, shape, weights, type_name, tokenizer_metadata, extra_kv=None,
               context_length=2048, extra_tensors=None):
    """Writes `weights` (Hugging Face names and orientation) as a GGUF file whose matrices are in
    `type_name`; norms and biases stay F32. `extra_kv`: more metadata, {key: str | float | int}
    (a key already written is replaced). `extra_tensors`: {GGUF name: float32 array}, as is."""
    qtype = GGUF_TYPES[type_name]
    writer = shape_writer(path, shape.arch, shape, context_length)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_layer_norm_rms_eps(shape.rms_eps)
    if "llama.rope.freq_base" not in (extra_kv or {}):
        writer.add_rope_freq_base(shape.rope_theta)
    for key, value in (extra_kv or {}).items():
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, value)
    for key, value, vtype, sub_type in tokenizer_metadata:
        writer.add_key_value(key, value, vtype, sub_type=sub_type)
    if shape.sliding_window is not None:
        writer.add_sliding_window(shape.sliding_window)
    if shape.llama3_rope is not None:
        writer.add_tensor("rope_freqs.weight", llama3_rope_freqs(shape))
    for name, w in (extra_tensors or {}).items():
        writer.add_tensor(name, np.asarray(w, dtype=np.float32))
    if shape.arch == "phi3":
        weights = fuse_for_phi3(weights)
    for name, w in weights.items():
        if shape.arch == "llama" and name.endswith("q_proj.weight"):
            w = permute_for_interleaved_rope(w, shape.heads)
        elif shape.arch == "llama" and name.endswith("k_proj.weight"):
            w = permute_for_interleaved_rope(w, shape.kv_heads)
        if w.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(gguf_name(name), w)
        elif qtype == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(gguf_name(name), w.astype(np.float16))
        else:
            writer.add_tensor(gguf_name(name), gguf.quants.quantize(w, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# Per matrix type: (max |dlogit| / (1 + max |logit|), near-tie margin, top-1 agreement outside
# near ties, mean |dlogit|); None where not checked. See the file comment.
TOLERANCES = {
    "F32": (1e-5, 1e-3, 1.0, None),
    "F16": (5e-3, 0.1, 1.0, None),
    "Q8_0": (None, 0.5, 0.99, 0.25),
    "Q4_1": (None, 0.5, 0.99, 0.25),
    "BF16": (1e-5, 1e-3, 1.0, None),  # safetensors BF16 against the same values as F32 GGUF
    "F16 KV": (5e-3, 0.1, 1.0, None),  # F32 matrices, both engines with an F16 KV cache
}


def check_logits(ours, ref, type_name, tolerances=None):
    """Asserts tolerances[type_name] (this file's TOLERANCES by default); returns a summary of the
    differences."""
    max_rel, near_tie, min_agreement, max_mean = (tolerances or TOLERANCES)[type_name]
    agreement, max_diff, mean_diff = compare(ours, ref, near_tie)
    scale = 1.0 + float(np.abs(ref).max())
    summary = (f"max |dlogit| {max_diff:.2e} ({max_diff / scale:.1e} of 1 + max |logit| "
               f"{scale:.1f}), mean {mean_diff:.2e}, top-1 agreement {agreement:.3f} outside near "
               f"ties (< {near_tie})")
    if max_rel is not None:
        assert max_diff <= max_rel * scale, summary
    if max_mean is not None:
        assert mean_diff < max_mean, summary
    assert agreement >= min_agreement, summary
    return summary


def bf16_round(w):
    """float32 -> bfloat16 bits (uint16), rounding to nearest even."""
    u = w.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def write_safetensors(path, tensors, type_name, header_align):
    """One safetensors file by hand: u64 header length | JSON header | data. The header is padded
    with spaces to a multiple of `header_align` bytes (1: no padding, so the data may be
    unaligned)."""
    header, blobs, offset = {}, [], 0
    for name, w in tensors.items():
        data = (bf16_round(w) if type_name == "BF16" else w.astype(np.float32)).tobytes()
        header[name] = {"dtype": type_name, "shape": list(w.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % header_align)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def write_hf_model(directory, shape, weights, type_name, vocab):
    """config.json and two shards: the first with an 8-aligned header, the second unaligned.
    Phi-3's matrices are fused as Hugging Face stores them; its GGUF `sliding_window` (which
    llama.cpp ignores) is left out of config.json, where transformers would apply it."""
    directory.mkdir()
    if shape.arch == "phi3":
        weights = fuse_for_phi3(weights)
    config = {
        "architectures": [HF_ARCHITECTURES[shape.arch]],
        "vocab_size": vocab, "hidden_size": shape.hidden, "intermediate_size": shape.ffn,
        "num_hidden_layers": shape.layers, "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads, "head_dim": shape.head_dim,
        "max_position_embeddings": 2048, "rms_norm_eps": shape.rms_eps,
        "rope_theta": shape.rope_theta, "tie_word_embeddings": shape.tied,
    }
    if shape.llama3_rope is not None:
        config["rope_scaling"] = shape.llama3_rope
    (directory / "config.json").write_text(json.dumps(config))
    names = list(weights)
    half = len(names) // 2
    write_safetensors(directory / "model-00001-of-00002.safetensors",
                      {n: weights[n] for n in names[:half]}, type_name, header_align=8)
    write_safetensors(directory / "model-00002-of-00002.safetensors",
                      {n: weights[n] for n in names[half:]}, type_name, header_align=1)


def compare_with_llama_cpp(shape, type_name, ours_path, ref_gguf, vocab, tmp_path,
                           kv_dtype="f32"):
    """Both engines with a KV cache of `kv_dtype` ("f32", so that only the matrices' arithmetic
    differs, or "f16"); `type_name` picks the tolerance."""
    tokens = np.random.default_rng(100 + SHAPES.index(shape)).integers(0, vocab, NUM_TOKENS)
    ggml_kv = GGML_TYPE_F32 if kv_dtype == "f32" else GGML_TYPE_F16
    ref, _ = reference(ref_gguf, tokens.tolist(), 0, type_k=ggml_kv, type_v=ggml_kv)
    ours, _ = tandem(ours_path, tokens.tolist(), 0, tmp_path, kv_dtype=kv_dtype)
    print(f"\n{shape.name} {type_name}: {check_logits(ours, ref, type_name)}")


@pytest.mark.parametrize("type_name", list(GGUF_TYPES))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
def test_random_gguf_matches_llama_cpp(shape, type_name, tokenizer_metadata, tmp_path):
    vocab = vocab_size(tokenizer_metadata)
    weights = random_weights(shape, vocab, SHAPES.index(shape))
    path = tmp_path / f"{shape.name}.{type_name}.gguf"
    write_gguf(path, shape, weights, type_name, tokenizer_metadata)
    compare_with_llama_cpp(shape, type_name, path, path, vocab, tmp_path)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
def test_random_gguf_with_f16_kv_cache_matches_llama_cpp(shape, tokenizer_metadata, tmp_path):
    """The F16 KV cache (the engine's default) against llama.cpp's, on F32 matrices so that the
    cache's rounding is what differs from the F32 comparison."""
    vocab = vocab_size(tokenizer_metadata)
    weights = random_weights(shape, vocab, SHAPES.index(shape))
    path = tmp_path / f"{shape.name}.F32.gguf"
    write_gguf(path, shape, weights, "F32", tokenizer_metadata)
    compare_with_llama_cpp(shape, "F16 KV", path, path, vocab, tmp_path, kv_dtype="f16")


@pytest.mark.parametrize("type_name", ["F32", "BF16"])
@pytest.mark.parametrize("shape", HF_SHAPES, ids=lambda s: s.name)
def test_random_safetensors_matches_llama_cpp_on_gguf(shape, type_name, tokenizer_metadata,
                                                      tmp_path):
    """Tandem on the Hugging Face layout (NeoX Q/K rows) against llama.cpp on the GGUF conversion
    (for "llama", Q/K rows permuted for interleaved pairs) of the same values."""
    vocab = vocab_size(tokenizer_metadata)
    weights = random_weights(shape, vocab, SHAPES.index(shape))
    if type_name == "BF16":  # the GGUF holds exactly the BF16 values, in F32
        weights = {n: (bf16_round(w).astype(np.uint32) << 16).view(np.float32)
                   for n, w in weights.items()}
    hf_dir = tmp_path / "hf"
    write_hf_model(hf_dir, shape, weights, type_name, vocab)
    gguf_path = tmp_path / f"{shape.name}.gguf"
    write_gguf(gguf_path, shape, weights, "F32", tokenizer_metadata)
    compare_with_llama_cpp(shape, type_name, hf_dir, gguf_path, vocab, tmp_path)


@pytest.mark.parametrize("shape", [s for s in SHAPES if s.llama3_rope is not None],
                         ids=lambda s: s.name)
def test_llama3_rope_metadata_matches_llama_cpp_rope_freqs(shape, tokenizer_metadata, tmp_path):
    """Tandem on a GGUF that states the scaling as metadata (`llama.rope.scaling.type` "llama3"
    and its parameters; Tandem computes the divisors) against llama.cpp on the converter's form
    (`rope_freqs.weight`), F32 matrices."""
    vocab = vocab_size(tokenizer_metadata)
    weights = random_weights(shape, vocab, SHAPES.index(shape))
    ref_path = tmp_path / "rope_freqs.gguf"
    write_gguf(ref_path, shape, weights, "F32", tokenizer_metadata)
    metadata_shape = replace(shape, llama3_rope=None)
    ours_path = tmp_path / "metadata.gguf"
    r = shape.llama3_rope
    write_gguf(ours_path, metadata_shape, weights, "F32", tokenizer_metadata, extra_kv={
        "llama.rope.freq_base": shape.rope_theta,
        "llama.rope.scaling.type": "llama3",
        "llama.rope.scaling.factor": r["factor"],
        "llama.rope.scaling.low_freq_factor": r["low_freq_factor"],
        "llama.rope.scaling.high_freq_factor": r["high_freq_factor"],
        "llama.rope.scaling.original_context_length": r["original_max_position_embeddings"],
    })
    compare_with_llama_cpp(shape, "F32", ours_path, ref_path, vocab, tmp_path)


# Mistral's sliding-window attention, as `llama.attention.sliding_window` (every layer). llama.cpp
# ignores that key for "llama" files, so the reference is built from a property of one layer: with a
# single layer and RoPE (which depends only on relative positions), the logits at position t under a
# window of W are the full-attention logits of the last W tokens alone, tokens[t - W + 1 .. t],
# evaluated by llama.cpp as a fresh sequence. Both runs here use F32 matrices and KV caches; Tandem's
# output is compared with the F32 tolerances. Measured: max |dlogit| 1.7e-5..2.5e-5; with the window
# left out on Tandem's side, the positions past it are off by max 37, mean 4.4. (Tandem's logits
# come one token per step, so this is the decode path; the prefill path's window, tile runs
# included, is held to the reference kernel in engine/cpu/paged_attention_test.cc.)
SWA_WINDOW = 16
SWA_SHAPES = [
    Shape("mistral_swa_gqa", "llama", hidden=128, heads=4, kv_heads=2, tied=True, head_dim=64,
          layers=1),
    Shape("mistral_swa_mha", "llama", hidden=64, heads=4, kv_heads=4, tied=False, layers=1),
]


@pytest.mark.parametrize("shape", SWA_SHAPES, ids=lambda s: s.name)
def test_sliding_window_matches_llama_cpp_on_each_window(shape, tokenizer_metadata, tmp_path):
    vocab = vocab_size(tokenizer_metadata)
    seed = len(SHAPES) + SWA_SHAPES.index(shape)
    weights = random_weights(shape, vocab, seed)
    path = tmp_path / f"{shape.name}.gguf"
    write_gguf(path, shape, weights, "F32", tokenizer_metadata,
               extra_kv={"llama.attention.sliding_window": SWA_WINDOW})
    tokens = np.random.default_rng(100 + seed).integers(0, vocab, NUM_TOKENS).tolist()
    ours, _ = tandem(path, tokens, 0, tmp_path, kv_dtype="f32")

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=512, n_batch=512, logits_all=True,
                          n_threads=2, verbose=False, seed=0, type_k=GGML_TYPE_F32,
                          type_v=GGML_TYPE_F32)
    ref = np.empty_like(ours)
    for t in range(NUM_TOKENS):
        window = tokens[max(0, t - SWA_WINDOW + 1): t + 1]
        llm.reset()
        llm.eval(window)
        ref[t] = np.array(llm.scores[len(window) - 1], dtype=np.float32)
    print(f"\n{shape.name} window {SWA_WINDOW}: {check_logits(ours, ref, 'F32')}")
