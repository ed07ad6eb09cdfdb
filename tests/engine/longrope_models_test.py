"""Phi-3 LongRoPE (Phi-3-mini/medium-128k, Phi-3.5-mini) on random-weight models, against
llama.cpp on GGUF files (llama_cpp) in both regimes.

LongRoPE divides each rotated pair's frequency by a factor from one of two lists (long, short)
and multiplies cos/sin by an attention factor. Tandem picks the list once per model load: long
when the context it serves (the model's context length) exceeds the original context
(docs/engine.md, "LongRoPE"). llama.cpp picks it per context the same way (n_ctx_seq against
`phi3.rope.scaling.original_context_length`), but pads n_ctx to a multiple of 256, so the
original context here is 256:
  - long regime: the file says context 1024, llama.cpp runs with n_ctx 512 (> 256);
  - short regime: the file says context 256 (= the original), llama.cpp runs with n_ctx 256.
The factor lists are spread like the real ones (long up to ~40, short near 1), so the two
regimes give clearly different logits (checked: a control that mixes them fails the bound by far).
The attention factor is the converter's sqrt(1 + ln(1024 / 256) / ln(256)), in both files.

F32 matrices, F32 KV caches in both engines: random_models_test.py's F32 bound (max |dlogit| <=
1e-5 * (1 + max |logit|), same top-1 wherever the margin >= 1e-3). Measured values are printed
(pytest -s). transformers_reference_test.py checks the Hugging Face folder form.
"""
import math
import subprocess

import numpy as np
import pytest

from random_models_test import (Shape, check_logits, random_weights, vocab_size, write_gguf,
                                tokenizer_metadata)  # noqa: F401 (a fixture)
from reference_common import BIN, GGML_TYPE_F32, compare, reference, tandem

ORIGINAL = 256
SHAPE = Shape("phi3_longrope", "phi3", hidden=128, heads=4, kv_heads=2, tied=False, head_dim=32)
HALF = SHAPE.head_dim // 2
LONG_FACTORS = np.geomspace(1.0, 40.0, HALF).astype(np.float32)
SHORT_FACTORS = np.linspace(1.0, 1.6, HALF).astype(np.float32)
ATTN_FACTOR = math.sqrt(1 + math.log(1024 / ORIGINAL) / math.log(ORIGINAL))
NUM_TOKENS = 64


def write_longrope_gguf(path, context_length, tokenizer_metadata, long_factors=LONG_FACTORS,
                        short_factors=SHORT_FACTORS):
    vocab = vocab_size(tokenizer_metadata)
    weights = random_weights(SHAPE, vocab, seed=31)
    write_gguf(path, SHAPE, weights, "F32", tokenizer_metadata,
               extra_kv={"phi3.rope.scaling.attn_factor": ATTN_FACTOR,
                         "phi3.rope.scaling.original_context_length": ORIGINAL},
               context_length=context_length,
               extra_tensors={"rope_factors_long.weight": long_factors,
                              "rope_factors_short.weight": short_factors})
    return vocab


def tokens_for(vocab):
    return np.random.default_rng(31).integers(0, vocab, NUM_TOKENS).tolist()


def llama_cpp_logits(path, tokens, n_ctx):
    ref, _ = reference(path, tokens, 0, n_ctx=n_ctx, type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32)
    return ref


@pytest.mark.parametrize("regime,context_length,n_ctx",
                         [("long", 1024, 512), ("short", ORIGINAL, ORIGINAL)])
def test_longrope_gguf_matches_llama_cpp(regime, context_length, n_ctx, tokenizer_metadata,
                                         tmp_path):
    path = tmp_path / f"phi3_longrope_{regime}.gguf"
    vocab = write_longrope_gguf(path, context_length, tokenizer_metadata)
    tokens = tokens_for(vocab)
    ref = llama_cpp_logits(path, tokens, n_ctx)
    ours, _ = tandem(path, tokens, 0, tmp_path, kv_dtype="f32")
    print(f"\nLongRoPE {regime} vs llama.cpp: {check_logits(ours, ref, 'F32')}")


def test_longrope_regimes_differ(tokenizer_metadata, tmp_path):
    """The control: Tandem in the long regime against llama.cpp in the short one (same file,
    llama.cpp's n_ctx at the original context) is far outside the bound, so the comparisons
    above see which list and factor each engine used."""
    path = tmp_path / "phi3_longrope.gguf"
    vocab = write_longrope_gguf(path, 1024, tokenizer_metadata)
    tokens = tokens_for(vocab)
    ref = llama_cpp_logits(path, tokens, ORIGINAL)
    ours, _ = tandem(path, tokens, 0, tmp_path, kv_dtype="f32")
    agreement, max_diff, mean_diff = compare(ours, ref, 1e-3)
    scale = 1.0 + float(np.abs(ref).max())
    print(f"\nlong (Tandem) vs short (llama.cpp): max |dlogit| {max_diff:.2e}, mean "
          f"{mean_diff:.2e}, top-1 {agreement:.3f}")
    assert max_diff > 100 * 1e-5 * scale


def test_longrope_attention_factor_matters(tokenizer_metadata, tmp_path):
    """The attention factor alone: Tandem on a file without it (1) against llama.cpp on the
    file with it, both in the long regime, is outside the bound."""
    path = tmp_path / "with.gguf"
    vocab = write_longrope_gguf(path, 1024, tokenizer_metadata)
    tokens = tokens_for(vocab)
    ref = llama_cpp_logits(path, tokens, 512)
    without = tmp_path / "without.gguf"
    write_gguf(without, SHAPE, random_weights(SHAPE, vocab, seed=31), "F32", tokenizer_metadata,
               extra_kv={"phi3.rope.scaling.original_context_length": ORIGINAL},
               context_length=1024,
               extra_tensors={"rope_factors_long.weight": LONG_FACTORS,
                              "rope_factors_short.weight": SHORT_FACTORS})
    ours, _ = tandem(without, tokens, 0, tmp_path, kv_dtype="f32")
    _, max_diff, _ = compare(ours, ref, 1e-3)
    assert max_diff > 100 * 1e-5 * (1.0 + float(np.abs(ref).max()))


@pytest.mark.parametrize("which,bad", [("long", "short list"), ("short", "zero"),
                                       ("long", "nan")])
def test_malformed_factors_are_refused(which, bad, tokenizer_metadata, tmp_path):
    factors = {"long": LONG_FACTORS.copy(), "short": SHORT_FACTORS.copy()}
    if bad == "short list":
        factors[which] = factors[which][:HALF - 2]
    elif bad == "zero":
        factors[which][3] = 0.0
    else:
        factors[which][5] = np.nan
    path = tmp_path / "bad.gguf"
    vocab = write_longrope_gguf(path, 1024, tokenizer_metadata, factors["long"],
                                factors["short"])
    p = subprocess.run([str(BIN / "logits_tool"), str(path), ",".join(map(str, tokens_for(vocab))),
                        str(tmp_path / "out.bin"), "0"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode != 0
    expected = {"short list": f"'rope_factors_{which}.weight'",
                "zero": f"{which}_factor[3] must be positive and finite",
                "nan": f"{which}_factor[5] must be positive and finite"}[bad]
    assert expected in p.stderr, p.stderr
