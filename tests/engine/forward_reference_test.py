"""Tandem's CPU forward pass against llama.cpp (through llama-cpp-python, built from source by
scripts/setup.sh) on the same GGUF file: logits at every position under teacher forcing, and the
greedy continuation.

Tolerances. Both engines quantize activations to 8 bits before every quantized matrix product.
Any difference in float rounding (summation order, F16 vs F32 KV cache, RoPE angles) flips some of
those 8-bit roundings, so the two engines differ by quantization noise: 0.16 to 0.25 logits on
average and up to ~1.9 at a few positions on this model, depending on the kernel ISA (measured for
scalar, AVX2 and AVX-512; the same size as Tandem's own spread when only the attention summation
order changes). So:
  - the mean |logit difference| must stay below MAX_MEAN_DIFF = 0.35 (a real bug, such as a wrong
    RoPE pairing or a missing bias, gives differences of several logits: ~6 on average for a
    missing Q/K permutation);
  - the top-1 token must agree wherever the reference's two best logits are more than NEAR_TIE
    apart, at >= 99% of positions, over the prompt and over the reference's 32-token greedy
    continuation (teacher forcing);
  - our own free-running greedy continuation must equal the reference's until the first step where
    the reference itself is at a near tie (below NEAR_TIE), and for all 32 tokens when there is
    none. Past a near tie either choice is correct and the texts legitimately part.
"""
import numpy as np
import pytest

from reference_common import DEFAULT_MODEL, NEAR_TIE, compare, margins, reference, tandem, tokenize

MAX_MEAN_DIFF = 0.35  # logits

PROMPTS = [
    "The history of the Roman Empire spans more than a thousand years, from the founding of the "
    "city to the fall of Constantinople. Its institutions, laws and languages shaped Europe.",
    "<|im_start|>user\nWrite a Python function that returns the n-th Fibonacci number.<|im_end|>\n"
    "<|im_start|>assistant\n",
    "Numbers: 3.14159 2.71828 1.41421; code: for (int i = 0; i < n; ++i) { sum += a[i]; }",
]

GREEDY_STEPS = 32


@pytest.mark.parametrize("prompt", PROMPTS)
def test_default_model_matches_llama_cpp(prompt, tmp_path):
    tokens = tokenize(DEFAULT_MODEL, prompt)
    assert len(tokens) > 20
    _, ref_greedy = reference(DEFAULT_MODEL, tokens, GREEDY_STEPS)
    # Teacher forcing over the prompt and the reference's greedy continuation.
    forced = tokens + ref_greedy
    ref_logits, _ = reference(DEFAULT_MODEL, forced, 0)
    our_logits, _ = tandem(DEFAULT_MODEL, forced, 0, tmp_path)
    agreement, max_diff, mean_diff = compare(our_logits, ref_logits)
    print(f"\n{len(forced)} positions: top-1 agreement {agreement:.4f}, "
          f"max |dlogit| {max_diff:.3f}, mean {mean_diff:.4f}")
    assert agreement >= 0.99
    assert mean_diff < MAX_MEAN_DIFF, "logits drift beyond quantization noise"

    # Free-running greedy decoding through Tandem's own KV cache.
    _, our_greedy = tandem(DEFAULT_MODEL, tokens, GREEDY_STEPS, tmp_path)
    ref_margins = margins(ref_logits[len(tokens) - 1:])  # the logits each greedy token came from
    first_tie = next((i for i in range(GREEDY_STEPS) if ref_margins[i] < NEAR_TIE), GREEDY_STEPS)
    print(f"greedy: identical for {first_tie} tokens required "
          f"({'no near tie' if first_tie == GREEDY_STEPS else 'near tie at step %d' % first_tie})")
    assert our_greedy[:first_tie] == ref_greedy[:first_tie]
    if first_tie < GREEDY_STEPS:
        # At the tie our choice is one of the reference's two best.
        top2 = np.argsort(ref_logits[len(tokens) - 1 + first_tie])[-2:]
        assert our_greedy[first_tie] in top2
