"""Runs inside .venv-hf (Debian's torch, PyPI's transformers; see
scripts/requirements-transformers.txt) for transformers_reference_test.py, which cannot import
torch itself (.venv has NumPy 2).

    transformers_forward.py JOBS.json

JOBS.json is a list of {"arch", "config" (keyword arguments of the architecture's config class),
"weights" (an .npz of float32 arrays under Hugging Face's names; Phi-3's already fused), "tokens",
"folders": [{"path", "dtype" ("F32" | "F16" | "BF16"), "max_shard_size" (or null)}]}.
For each folder the model is built from its config class, given the weights, cast to the dtype
and written by save_pretrained (safetensors; sharded, with an index, where max_shard_size is set);
then the folder is read back with from_pretrained and, on `tokens` in one batch, this writes into it
  logits_f32.npy  the forward of the values the folder holds (the weights rounded to the dtype),
                  loaded as float32 and computed in float32,
  logits_own.npy  for BF16 only, the forward computed in bfloat16 as transformers runs a BF16
                  model (torch 1.13 has no float16 matrix product on the CPU, so F16 has none).
"""
import json
import sys

import numpy as np
import torch
import transformers

CLASSES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    "phi3": (transformers.Phi3Config, transformers.Phi3ForCausalLM),
    "gemma": (transformers.GemmaConfig, transformers.GemmaForCausalLM),
    "gemma2": (transformers.Gemma2Config, transformers.Gemma2ForCausalLM),
}
DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def forward(model, tokens):
    # No cache: Gemma 2's default (HybridCache) needs torch >= 2; one batch does not use it.
    with torch.no_grad():
        return model(torch.tensor([tokens]), use_cache=False).logits[0].float().numpy()


def main():
    torch.set_num_threads(2)
    jobs = json.load(open(sys.argv[1]))
    for job in jobs:
        config_class, model_class = CLASSES[job["arch"]]
        config = config_class(**job["config"], attn_implementation="eager")
        weights = np.load(job["weights"])
        state = {name: torch.from_numpy(weights[name]) for name in weights.files}
        if config.tie_word_embeddings:
            state["lm_head.weight"] = state["model.embed_tokens.weight"]
        for folder in job["folders"]:
            model = model_class(config).eval()
            model.load_state_dict(state, strict=True)
            model = model.to(DTYPES[folder["dtype"]])
            options = {}
            if folder["max_shard_size"]:
                options["max_shard_size"] = folder["max_shard_size"]
            model.save_pretrained(folder["path"], safe_serialization=True, **options)
            # Read back as a user would, so that what is compared is what the folder holds
            # (computed in float32, and for BF16 also in bfloat16 as transformers runs it).
            for name, dtype in (("f32", "F32"), ("own", folder["dtype"])):
                if name == "own" and dtype != "BF16":
                    continue
                loaded = model_class.from_pretrained(folder["path"], torch_dtype=DTYPES[dtype],
                                                     attn_implementation="eager").eval()
                np.save(f"{folder['path']}/logits_{name}.npy", forward(loaded, job["tokens"]))
    print(json.dumps({"torch": torch.__version__, "transformers": transformers.__version__}))


if __name__ == "__main__":
    main()
