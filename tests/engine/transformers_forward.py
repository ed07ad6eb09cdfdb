"""Runs inside .venv-hf (Debian's torch 1.13, PyPI's transformers 4.49; see
scripts/requirements-transformers.txt) for transformers_reference_test.py, and inside .venv-torch
(PyPI's torch 2 and transformers 5; scripts/setup_torch.sh) for transformers_torch_test.py, which
cannot import torch themselves (.venv has NumPy 2 and no torch).

    transformers_forward.py JOBS.json

JOBS.json is a list of {"arch", "config" (keyword arguments of the architecture's config class),
"weights" (an .npz of float32 arrays under Hugging Face's names; Phi-3's already fused), "tokens",
"folders": [{"path", "dtype" ("F32" | "F16" | "BF16"), "max_shard_size" (or null)}],
"own": the dtypes whose folders also get logits_own.npy}.
For each folder the model is built from its config class, given the weights, cast to the dtype
and written by save_pretrained (safetensors; sharded, with an index, where max_shard_size is set);
then the folder is read back with from_pretrained and, on `tokens` in one batch, this writes into it
  logits_f32.npy  the forward of the values the folder holds (the weights rounded to the dtype),
                  loaded as float32 and computed in float32,
  logits_own.npy  for the dtypes in "own", the forward computed in that dtype as transformers
                  runs a 16-bit model (torch 1.13 has no float16 matrix product on the CPU, so
                  there only BF16; torch 2 has one).
transformers 5 writes config.json in its own form (rope_parameters in place of rope_theta,
rope_scaling and Gemma 3's rope_local_base_freq; layer_types spelled out), which is what a folder
saved by a current transformers holds.
"""
import json
import sys

import numpy as np
import torch
import transformers

NAMES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "phi3": ("Phi3Config", "Phi3ForCausalLM"),
    "gemma": ("GemmaConfig", "GemmaForCausalLM"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),  # transformers >= 4.51
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM"),  # transformers >= 4.50
}
DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
NEW = int(transformers.__version__.split(".")[0]) >= 5
# transformers 5 renamed from_pretrained's torch_dtype and always writes safetensors.
DTYPE_ARG = "dtype" if NEW else "torch_dtype"
SAVE_OPTIONS = {} if NEW else {"safe_serialization": True}


def classes(arch):
    config_name, model_name = NAMES[arch]
    if not hasattr(transformers, model_name):
        sys.exit(f"transformers {transformers.__version__} has no {model_name}")
    return getattr(transformers, config_name), getattr(transformers, model_name)


def forward(model, tokens):
    # No cache: Gemma 2's default (HybridCache) needs torch >= 2; one batch does not use it.
    with torch.no_grad():
        return model(torch.tensor([tokens]), use_cache=False).logits[0].float().numpy()


def main():
    torch.set_num_threads(2)
    jobs = json.load(open(sys.argv[1]))
    for job in jobs:
        config_class, model_class = classes(job["arch"])
        config = config_class(**job["config"], attn_implementation="eager")
        weights = np.load(job["weights"])
        state = {name: torch.from_numpy(weights[name]) for name in weights.files}
        if config.tie_word_embeddings:
            state["lm_head.weight"] = state["model.embed_tokens.weight"]
        for folder in job["folders"]:
            model = model_class(config).eval()
            model.load_state_dict(state, strict=True)
            model = model.to(DTYPES[folder["dtype"]])
            options = dict(SAVE_OPTIONS)
            if folder["max_shard_size"]:
                options["max_shard_size"] = folder["max_shard_size"]
            model.save_pretrained(folder["path"], **options)
            # Read back as a user would, so that what is compared is what the folder holds
            # (computed in float32, and also in its own dtype as transformers runs it).
            for name, dtype in (("f32", "F32"), ("own", folder["dtype"])):
                if name == "own" and dtype not in job["own"]:
                    continue
                loaded = model_class.from_pretrained(folder["path"], attn_implementation="eager",
                                                     **{DTYPE_ARG: DTYPES[dtype]}).eval()
                np.save(f"{folder['path']}/logits_{name}.npy", forward(loaded, job["tokens"]))
    print(json.dumps({"torch": torch.__version__, "transformers": transformers.__version__}))


if __name__ == "__main__":
    main()
