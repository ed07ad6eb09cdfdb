"""Tandem's CPU forward pass against llama.cpp on small random Gemma models: GGUF "gemma" (Gemma 1:
embeddings scaled by sqrt(hidden), GELU-gated FFN, tied output), "gemma2" (also sandwich norms,
attention and final logit soft-capping, a sliding window on every other layer) and "gemma3"
(sandwich norms and per-head Q/K norms, five windowed layers of six with their own RoPE base, the
model's linear RoPE scaling on the full-attention layers only, an optional final soft-cap).

The weights are random, written the way llama.cpp's converter writes Gemma (GGUF names, norm
weights with Gemma's +1 already folded in, Q/K rows unpermuted for NeoX RoPE pairs); the tokenizer
metadata is the default model's. So that each feature shows in the logits, the window is 8
positions over 64 tokens, the caps are small next to the values they cap (Q/K scaled so scores
have a std of about 5 against an attention cap of 4; logits reach ~40 against a final cap of 25),
and Gemma 3's two RoPE bases differ by 100x.

Teacher-forced logits, one token per step (the decode path), F32 KV caches on both sides, and in
chunks of 24 tokens (prefill and chunked prefill; only each chunk's last row is compared), plus a
few greedy tokens:
  - F32 matrices: llama.cpp's GELU reads a table at F16 precision (its input rounded to F16, the
    output stored as F16: a relative error up to ~5e-4), Tandem computes it in float32, and the
    difference goes through the network: measured max |dlogit| 6.6e-3..3.4e-2 (at most 5.9e-4 of
    1 + max |logit|), mean 9e-4..3.2e-3, every top-1 equal. Required: max |dlogit| <= 1e-3 *
    (1 + max |logit|), mean < 5e-3, the same top-1 wherever the reference's margin is at least
    0.01, and the same 4 greedy tokens.
  - Q8_0 / Q4_1 matrices: the issue's thresholds, top-1 >= 99% where the margin is >= 0.5 and
    mean |dlogit| < 0.35; measured mean 0.07..0.27, max 0.47..2.3, top-1 100%.
Each feature shows: with Tandem given a file without it (llama.cpp keeping it), F32 logits are off
by max |dlogit| 37 / mean 5.0 / top-1 66% (gemma2_gqa, no attention cap), 50 / 1.0 (no final
cap), 42 / 5.8 / 69% (no window); gemma3_gqa: 46 / 5.8 / 53% (the global base on windowed layers),
21 / 2.2 / 70% (no linear RoPE scaling), 77 / 9.0 / 38% (no window).

Hugging Face folders of the same values (GemmaForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM;
config.json stating what the GGUF metadata states, norm weights stored as w for Gemma's 1 + w;
F32, and BF16 against a GGUF of the same rounded values) against llama.cpp on the GGUF, decode
path, F32 tolerances: measured max |dlogit| 9.5e-3..3.6e-2, every top-1 equal. The folder test
sees Gemma 3's settings: with rope_local_base_freq 1e6 in gemma3_gqa's config.json, max |dlogit|
32 / mean 3.1; without its rope_scaling, 16 / 1.9.
"""
import json
from dataclasses import dataclass

import gguf
import numpy as np
import pytest

# tokenizer_metadata is a module-scoped fixture: imported here, pytest uses it for these tests too.
from random_models_test import (bf16_round, check_logits, random_makers,  # noqa: F401
                                shape_writer, tokenizer_metadata, vocab_size,
                                write_safetensors)
from reference_common import GGML_TYPE_F32, reference, tandem

NUM_TOKENS = 64
CHUNK = 24
GREEDY = 4
WINDOW = 8

@dataclass(frozen=True)
class Shape:
    name: str
    arch: str  # "gemma" | "gemma2" | "gemma3"
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    ffn: int = 192
    attn_softcap: float | None = None  # gemma2.attn_logit_softcapping
    final_softcap: float | None = None  # {arch}.final_logit_softcapping
    window: int | None = None  # {arch}.attention.sliding_window
    rope_theta: float = 10000.0
    rope_theta_swa: float | None = None  # gemma3.rope.freq_base_swa
    linear_rope: float | None = None  # {arch}.rope.scaling.{type = linear, factor}
    untied: bool = False  # gemma3 may carry output.weight


SHAPES = [
    # Gemma 1 2B's multi-query attention, head_dim 48 != hidden / heads.
    Shape("gemma_mqa", "gemma", hidden=128, heads=4, kv_heads=1, head_dim=48, layers=2),
    Shape("gemma2_gqa", "gemma2", hidden=128, heads=4, kv_heads=2, head_dim=32, layers=4,
          attn_softcap=4.0, final_softcap=25.0, window=WINDOW),
    # head_dim 64: Tandem's AVX tile kernels would run but for the soft-cap.
    Shape("gemma2_mha_hd64", "gemma2", hidden=128, heads=2, kv_heads=2, head_dim=64, layers=2,
          attn_softcap=4.0, final_softcap=25.0, window=WINDOW),
    # Gemma 3 1B's layout: layers 0-4 windowed with base 1e4, layer 5 global with base 1e6 and the
    # linear RoPE scaling; head_dim 64 runs the AVX tile kernels.
    Shape("gemma3_gqa", "gemma3", hidden=128, heads=4, kv_heads=1, head_dim=64, layers=6,
          window=WINDOW, rope_theta=1000000.0, rope_theta_swa=10000.0, linear_rope=8.0),
    Shape("gemma3_untied_softcap", "gemma3", hidden=128, heads=4, kv_heads=2, head_dim=32,
          layers=3, window=WINDOW, rope_theta=1000000.0, final_softcap=25.0, untied=True),
]

TYPES = {
    "F32": gguf.GGMLQuantizationType.F32,
    "Q8_0": gguf.GGMLQuantizationType.Q8_0,
    "Q4_1": gguf.GGMLQuantizationType.Q4_1,
}

# (max |dlogit| / (1 + max |logit|), near-tie margin, top-1 agreement outside near ties,
# mean |dlogit|); None where not checked. See the file comment.
TOLERANCES = {
    "F32": (1e-3, 1e-2, 1.0, 5e-3),
    "Q8_0": (None, 0.5, 0.99, 0.35),
    "Q4_1": (None, 0.5, 0.99, 0.35),
}


def random_weights(shape, vocab, seed):
    """GGUF names -> float32 arrays in PyTorch orientation ([out, in])."""
    rng = np.random.default_rng(seed)
    h, f = shape.hidden, shape.ffn
    dq, dkv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    matrix, norm = random_makers(rng)  # norms around 1: what the converter writes, Gemma's w + 1

    # Scores of q·k / sqrt(head_dim) with a std of about gain²: 2.2 gives about 5.
    qk_gain = 2.2
    # The scaled embedding has an RMS of sqrt(hidden) = 11; each block adds about as much (through
    # the post norms' weights, or Gemma 1's output gains), so that the input token does not decide
    # every tied logit's top-1.
    out_gain = 1.0 if shape.arch == "gemma" else 4.0
    block_gain = 4.0 if shape.arch == "gemma" else 1.0
    w = {"token_embd.weight": rng.standard_normal((vocab, h)).astype(np.float32)}
    for i in range(shape.layers):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = norm(h)
        w[p + "attn_q.weight"] = matrix(dq, h, qk_gain)
        w[p + "attn_k.weight"] = matrix(dkv, h, qk_gain)
        w[p + "attn_v.weight"] = matrix(dkv, h, 1.0)
        w[p + "attn_output.weight"] = matrix(h, dq, block_gain)
        if shape.arch == "gemma3":
            # Normalized heads: scores' std about 2.2², as above.
            w[p + "attn_q_norm.weight"] = norm(shape.head_dim, qk_gain)
            w[p + "attn_k_norm.weight"] = norm(shape.head_dim, qk_gain)
        if shape.arch != "gemma":
            w[p + "post_attention_norm.weight"] = norm(h, out_gain)
            w[p + "post_ffw_norm.weight"] = norm(h, out_gain)
        w[p + "ffn_norm.weight"] = norm(h)
        w[p + "ffn_gate.weight"] = matrix(f, h, 1.5)
        w[p + "ffn_up.weight"] = matrix(f, h, 1.0)
        w[p + "ffn_down.weight"] = matrix(h, f, block_gain)
    w["output_norm.weight"] = norm(h)  # tied logits: a std of about sqrt(hidden) = 11
    if shape.untied:
        w["output.weight"] = matrix(vocab, h, 12.0)
    return w


def write_gguf(path, shape, weights, type_name, tokenizer_metadata):
    qtype = TYPES[type_name]
    a = shape.arch
    writer = shape_writer(path, a, shape, 2048)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(shape.rope_theta)
    if shape.attn_softcap is not None:
        writer.add_attn_logit_softcapping(shape.attn_softcap)
    if shape.final_softcap is not None:
        writer.add_final_logit_softcapping(shape.final_softcap)
    if shape.window is not None:
        writer.add_sliding_window(shape.window)
    if shape.rope_theta_swa is not None:
        writer.add_float32(f"{a}.rope.freq_base_swa", shape.rope_theta_swa)
    if shape.linear_rope is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(shape.linear_rope)
    for key, value, vtype, sub_type in tokenizer_metadata:
        writer.add_key_value(key, value, vtype, sub_type=sub_type)
    for name, w in weights.items():
        if w.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, w)
        else:
            writer.add_tensor(name, gguf.quants.quantize(w, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def check(ours, ref, type_name, what):
    """Asserts TOLERANCES[type_name] on the rows where `ours` has logits; returns a summary."""
    rows = ~np.isnan(ours).any(axis=1)
    return f"{what}: {rows.sum()} rows, " + check_logits(ours[rows], ref[rows], type_name, TOLERANCES)


def model_and_tokens(shape, type_name, tokenizer_metadata, tmp_path):
    vocab = vocab_size(tokenizer_metadata)
    seed = SHAPES.index(shape)
    path = tmp_path / f"{shape.name}.{type_name}.gguf"
    write_gguf(path, shape, random_weights(shape, vocab, seed), type_name, tokenizer_metadata)
    tokens = np.random.default_rng(200 + seed).integers(0, vocab, NUM_TOKENS).tolist()
    return path, tokens


@pytest.mark.parametrize("type_name", list(TYPES))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
def test_random_gemma_gguf_matches_llama_cpp(shape, type_name, tokenizer_metadata, tmp_path):
    path, tokens = model_and_tokens(shape, type_name, tokenizer_metadata, tmp_path)
    greedy = GREEDY if type_name == "F32" else 0
    ref, ref_greedy = reference(path, tokens, greedy, type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32)
    ours, our_greedy = tandem(path, tokens, greedy, tmp_path, kv_dtype="f32")
    print(f"\n{shape.name} {type_name} {check(ours, ref, type_name, 'decode')}")
    chunked, _ = tandem(path, tokens, 0, tmp_path, kv_dtype="f32", chunk=CHUNK)
    print(f"{shape.name} {type_name} {check(chunked, ref, type_name, f'prefill by {CHUNK}')}")
    assert our_greedy == ref_greedy
    # The chunks again with the MLP in passes of 16 rows (a 24-row chunk is two passes; the
    # engine's default takes it in one): Gemma's post norms and GeGLU give the same bits.
    passes, _ = tandem(path, tokens, 0, tmp_path, kv_dtype="f32", chunk=CHUNK, mlp_rows=16)
    assert np.array_equal(passes, chunked, equal_nan=True)


# Hugging Face folders of the same models (Gemma3ForCausalLM has no transformers here that runs it;
# Gemma 1/2 folders are also checked against transformers in transformers_reference_test.py).
HF_ARCHITECTURES = {"gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM",
                    "gemma3": "Gemma3ForCausalLM"}
HF_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def hf_layer_names(arch):
    return {
        "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
        "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
        "post_attention_norm": "post_attention_layernorm",
        # Gemma 1 is laid out as Llama; Gemma 2/3 have a norm before and after the FFN.
        "ffn_norm": "post_attention_layernorm" if arch == "gemma" else "pre_feedforward_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm", "ffn_gate": "mlp.gate_proj",
        "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}


def hf_weights(shape, weights):
    """GGUF-named weights -> Hugging Face names, the norms as Hugging Face stores them: w, where
    the model multiplies by 1 + w (the GGUF holds 1 + w)."""
    names = hf_layer_names(shape.arch)
    out = {}
    for name, w in weights.items():
        base = name.removesuffix(".weight")
        if base in HF_TOP:
            hf = HF_TOP[base]
        else:
            _, layer, part = base.split(".", 2)
            hf = f"model.layers.{layer}.{names[part]}"
        out[hf + ".weight"] = w - np.float32(1.0) if "norm" in base else w
    return out


def gguf_weights(shape, hf):
    """The inverse of hf_weights: norms 1 + w in float32, as Tandem's loader computes them."""
    back = {v: k for k, v in hf_layer_names(shape.arch).items()}
    out = {}
    for name, w in hf.items():
        base = name.removesuffix(".weight")
        top = next((k for k, v in HF_TOP.items() if v == base), None)
        if top is None:
            _, _, layer, part = base.split(".", 3)
            if part == "post_attention_layernorm":
                top = f"blk.{layer}.{'ffn_norm' if shape.arch == 'gemma' else 'post_attention_norm'}"
            else:
                top = f"blk.{layer}.{back[part]}"
        out[top + ".weight"] = np.float32(1.0) + w if "norm" in base else w
    return out


def hf_config(shape, vocab):
    """config.json saying what write_gguf's metadata says (and what llama.cpp assumes: q·k scaled
    by 1 / sqrt(head_dim), Gemma 3's five windowed layers of six with a base of 10000)."""
    c = {"architectures": [HF_ARCHITECTURES[shape.arch]], "vocab_size": vocab,
         "hidden_size": shape.hidden, "intermediate_size": shape.ffn,
         "num_hidden_layers": shape.layers, "num_attention_heads": shape.heads,
         "num_key_value_heads": shape.kv_heads, "head_dim": shape.head_dim,
         "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "rope_theta": shape.rope_theta,
         "tie_word_embeddings": not shape.untied, "hidden_activation": "gelu_pytorch_tanh"}
    if shape.arch != "gemma":
        c.update(query_pre_attn_scalar=shape.head_dim, sliding_window=shape.window,
                 attn_logit_softcapping=shape.attn_softcap,
                 final_logit_softcapping=shape.final_softcap)
    if shape.arch == "gemma3":
        c.update(sliding_window_pattern=6, rope_local_base_freq=shape.rope_theta_swa or 10000.0,
                 model_type="gemma3_text")
        if shape.linear_rope is not None:
            c["rope_scaling"] = {"rope_type": "linear", "factor": shape.linear_rope}
    return c


@pytest.mark.parametrize("type_name", ["F32", "BF16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
def test_hf_folder_matches_llama_cpp_on_gguf_of_same_values(shape, type_name, tokenizer_metadata,
                                                            tmp_path):
    """A Hugging Face folder (F32, or BF16 with the GGUF holding the same rounded values) against
    llama.cpp on the GGUF: the F32 tolerances, as both compute in float32."""
    vocab = vocab_size(tokenizer_metadata)
    seed = SHAPES.index(shape)
    hf = hf_weights(shape, random_weights(shape, vocab, seed))
    if type_name == "BF16":
        hf = {n: (bf16_round(w).astype(np.uint32) << 16).view(np.float32) for n, w in hf.items()}
    folder = tmp_path / f"{shape.name}-{type_name}"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(hf_config(shape, vocab)))
    write_safetensors(folder / "model.safetensors", hf, type_name, header_align=8)
    path = tmp_path / f"{shape.name}.gguf"
    write_gguf(path, shape, gguf_weights(shape, hf), "F32", tokenizer_metadata)
    tokens = np.random.default_rng(200 + seed).integers(0, vocab, NUM_TOKENS).tolist()
    ref, _ = reference(path, tokens, 0, type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32)
    ours, _ = tandem(folder, tokens, 0, tmp_path, kv_dtype="f32")
    print(f"\n{shape.name} {type_name} folder {check(ours, ref, 'F32', 'decode')}")
