"""What the engine reference tests share: running llama.cpp (through llama-cpp-python) and Tandem's
logits_tool on a model, and the margin-aware comparison of their logits.

See forward_reference_test.py for why quantized models are compared with margins rather than a
plain tolerance.
"""
import json
import os
import subprocess
from pathlib import Path

import numpy as np

import llama_cpp  # installed by scripts/setup.sh; its absence fails the test, never skips it

SOURCE = Path(os.environ["TANDEM_SOURCE_DIR"])
BIN = Path(os.environ["TANDEM_BIN_DIR"])
DEFAULT_MODEL = SOURCE / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"

# Logits: below this gap between the reference's two best tokens, quantization noise (up to ~1.9
# at single positions) may legitimately swap them; top-1 flips were seen at gaps up to ~0.3.
NEAR_TIE = 0.5

# llama.cpp's ggml type ids, for Llama(type_k=..., type_v=...).
GGML_TYPE_F32 = 0
GGML_TYPE_F16 = 1


def reference(model_path, tokens, greedy_steps, **llama_options):
    """llama.cpp's logits [len(tokens), vocab] (all tokens in one batch) and its greedy
    continuation of `greedy_steps` tokens. `llama_options` go to llama_cpp.Llama."""
    options = dict(n_ctx=512, n_batch=512, logits_all=True, n_threads=2, verbose=False, seed=0)
    options.update(llama_options)
    llm = llama_cpp.Llama(model_path=str(model_path), **options)
    llm.reset()
    llm.eval(tokens)
    logits = np.array(llm.scores[: len(tokens)], dtype=np.float32)
    generated = []
    last = logits[-1]
    for _ in range(greedy_steps):
        nxt = int(np.argmax(last))
        generated.append(nxt)
        llm.eval([nxt])
        last = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    return logits, generated


def tandem(model_path, tokens, greedy_steps, tmp_path, block_size=16, kv_dtype="f16", chunk=1,
           mlp_rows=0):
    """Tandem's logits [len(tokens), vocab] (one token per step through the paged KV cache, whose
    elements are `kv_dtype`: "f16", the engine's default, or "f32") and its greedy continuation,
    from logits_tool. `model_path` is a GGUF file or a Hugging Face model directory. With
    `chunk` > 1 the tokens go `chunk` per step (a chunked prefill) and only each chunk's last row
    holds logits (the others are NaN). `mlp_rows` > 0 runs each step's output projection and MLP
    in passes of that many rows (CpuBackend::Options::mlp_rows_per_pass)."""
    out = tmp_path / "logits.bin"
    p = subprocess.run([str(BIN / "logits_tool"), str(model_path), ",".join(map(str, tokens)),
                        str(out), str(greedy_steps), str(block_size), kv_dtype, str(chunk),
                        str(mlp_rows)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout)
    logits = np.fromfile(out, dtype=np.float32).reshape(len(tokens), info["vocab"])
    return logits, info["greedy"]


def tokenize(model_path, text):
    llm = llama_cpp.Llama(model_path=str(model_path), n_ctx=512, vocab_only=True, verbose=False)
    return llm.tokenize(text.encode(), add_bos=False, special=True)


def margins(logits):
    """Per row, the gap between the two largest logits."""
    top2 = np.sort(logits, axis=-1)[:, -2:]
    return top2[:, 1] - top2[:, 0]


def compare(ours, ref, near_tie=NEAR_TIE):
    """(top-1 agreement over the rows where the reference's margin is at least `near_tie` (rows
    below it count as agreeing), max |difference|, mean |difference|)."""
    assert ours.shape == ref.shape
    decided = margins(ref) >= near_tie
    agree = (ours.argmax(-1) == ref.argmax(-1)) | ~decided
    diff = np.abs(ours - ref)
    return agree.mean(), float(diff.max()), float(diff.mean())
