"""transformers_reference_test.py's check on PyPI torch 2 and transformers 5 (.venv-torch):
Hugging Face folders written by transformers' own config classes and save_pretrained, loaded by
Tandem's logits_tool, against transformers' forward on the same token ids, with the same bounds.

What Debian's torch 1.13 cannot run (transformers >= 4.50/4.51 needs torch 2):
  - Qwen3 (Qwen3ForCausalLM: per-head RMSNorm of Q and K before RoPE), grouped-query, tied,
    head_dim 64 != hidden / heads.
  - Gemma 3 (Gemma3ForCausalLM, text only): Gemma 2's sandwich norms (stored as w for 1 + w),
    per-head Q/K norms, embeddings scaled by sqrt(hidden), a window of 8 positions that the 64
    tokens cross on the sliding layers, their own RoPE base (rope_local_base_freq 1e4 against
    1e6) and the linear RoPE scaling on the global layers only, query_pre_attn_scalar !=
    head_dim. gemma3_pattern3: six layers, sliding_window_pattern 3 (layers 2 and 5 global),
    multi-query. gemma3_layer_types: three layers with layer_types sliding, full, sliding (not a
    period), untied output, a final soft-cap of 25 that the logits reach.
and every case of transformers_reference_test.py again on the new transformers, whose
config.json is in its own form (rope_parameters, nested per layer type for Gemma 3, in place of
rope_theta / rope_scaling / rope_local_base_freq), as folders saved by a current transformers are.
torch 2 has a float16 matrix product on the CPU, so F16 folders are also compared with
transformers computing in float16, with BF16's bound (issue 31's: top-1 >= 99% outside near
ties, mean |dlogit| < 0.35). Measured values are printed (pytest -s); on torch 2.15.0 and
transformers 5.25.0, against the float32 forward: Qwen3 max |dlogit| <= 6.3e-5, Gemma 3
<= 1.6e-4 (1.5e-6 of 1 + max |logit|), the others <= 7.4e-5, top-1 100%; against the forward in
the folder's own dtype: BF16 mean 0.06-0.20 (gemma3_pattern3 0.196, max 2.2), F16 mean
0.008-0.026, top-1 100% outside near ties. Without transformers 5's rope_parameters read, every
folder whose RoPE is not the family's default failed (Qwen3 max |dlogit| 36); each Gemma 3
setting shows (F32, max / mean |dlogit| with config.json changed): pattern 6 in place of 3:
35 / 4.0, query_pre_attn_scalar 64: 5.4 / 0.51, the global base on sliding layers: 26 / 3.3, no
linear scaling: 25 / 3.7, no window: 47 / 6.3, no final cap: 28 / 1.2.

Opt-in: .venv-torch (about 4.3 GB: PyPI's torch is the CUDA build) is made by
scripts/setup_torch.sh, not scripts/setup.sh. Without it every case is skipped in about a second
(ctest reports the test skipped); TANDEM_TORCH=1 makes a missing environment a failure.
TANDEM_TORCH_VENV names another environment. About 25 s on 2 cores with it.
"""
import os
from pathlib import Path

import pytest

import gemma_models_test as gemma
import transformers_reference_test as base
from random_models_test import SHAPES as LLAMA_SHAPES
from reference_common import SOURCE

VENV = Path(os.environ.get("TANDEM_TORCH_VENV", SOURCE / ".venv-torch"))
PYTHON = VENV / "bin" / "python"

if not PYTHON.exists():
    why = (f"transformers on torch 2 is opt-in: {VENV} does not exist; run scripts/setup_torch.sh "
           "to make it (~4.3 GB), then run this test again")
    if os.environ.get("TANDEM_TORCH") == "1":
        pytest.fail(f"TANDEM_TORCH=1 but {why}", pytrace=False)
    pytest.skip(why, allow_module_level=True)

Case = base.Case
GEMMA3_GQA = next(s for s in gemma.SHAPES if s.name == "gemma3_gqa")
GEMMA3_CAPPED = next(s for s in gemma.SHAPES if s.name == "gemma3_untied_softcap")

NEW_CASES = [
    Case("qwen3_gqa_tied", "qwen3", next(s for s in LLAMA_SHAPES if s.name == "qwen3_gqa_tied"),
         (("F32", None), ("F16", None), ("BF16", "200KB")), {}),
    # Scores scaled by 1 / sqrt(48), not 1 / sqrt(head_dim = 64).
    Case("gemma3_pattern3", "gemma3", GEMMA3_GQA,
         (("F32", None), ("F16", "300KB"), ("BF16", None)),
         {"hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 48,
          "sliding_window_pattern": 3}),
    Case("gemma3_layer_types", "gemma3", GEMMA3_CAPPED,
         (("F32", None), ("BF16", "200KB")),
         {"hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 24,
          "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}),
]
CASES = NEW_CASES + base.CASES
OWN = ("F16", "BF16")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return base.write_folders(tmp_path_factory.mktemp("transformers_torch"), PYTHON, CASES, OWN)


PARAMS = [(c.name, dtype) for c in CASES for dtype, _ in c.folders]


@pytest.mark.parametrize("name,dtype", PARAMS, ids=[f"{n}-{d}" for n, d in PARAMS])
def test_folder_logits_match_transformers_on_torch2(folders, name, dtype, tmp_path):
    base.check_folder(folders, CASES, name, dtype, OWN, tmp_path)
