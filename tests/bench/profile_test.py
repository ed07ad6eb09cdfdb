"""`tandem profile --roofline` (bench/tandem_bench/profile.py): the profile's coefficients equal the
roofline formulas of docs/sim.md computed here from the vendors' published figures and from the
model read with PyPI's gguf (or written with PyPI's safetensors), and bad input is named."""
import json
import os
import pathlib
import subprocess

import pytest
from gguf import GGUFReader

from conftest import ROOT
from tandem_bench import profile, sim

GGUF = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
HF_VENV = pathlib.Path(os.environ.get("TANDEM_HF_VENV", ROOT / ".venv-hf"))

# NVIDIA's spec sheets (nvidia.com/en-us/data-center/h100/, .../h200/): BF16 Tensor Core 1,979
# TFLOPS with sparsity, i.e. half that dense; HBM 3.35 TB/s (H100 SXM) and 4.8 TB/s (H200).
H100 = {"flops": 1979e12 / 2, "bw": 3.35e12, "mem": 80e9}
H200 = {"flops": 1979e12 / 2, "bw": 4.8e12, "mem": 141e9}


def make(tmp_path, *args):
    out = tmp_path / "p.json"
    assert profile.main(["--roofline", "--out", str(out), *map(str, args)]) == 0
    return json.loads(out.read_text())


def expected(weight_bytes, matmul_params, layers, heads, kv_heads, head_dim, gpu, mfu=0.5,
             mbu=0.8, launch_s=0.0, kv_bytes=2):
    kv = 2 * layers * kv_heads * head_dim * kv_bytes
    return {"base_seconds": weight_bytes / (gpu["bw"] * mbu) + launch_s,
            "prefill_token_seconds": 2 * matmul_params / (gpu["flops"] * mfu),
            "decode_token_seconds": 2 * matmul_params / (gpu["flops"] * mfu),
            "context_token_seconds": kv / (gpu["bw"] * mbu),
            "prompt_context_token_seconds": 4 * layers * heads * head_dim / (gpu["flops"] * mfu)}, kv


def check_step(got, want):
    assert set(got) == set(want)
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-12), key


def test_gguf_model_on_an_h100(tmp_path):
    reader = GGUFReader(str(GGUF))

    def meta(key):
        field = reader.fields[key]
        return int(field.parts[field.data[0]][0])

    tensors = {t.name: t for t in reader.tensors}
    assert "output.weight" not in tensors  # SmolLM2 ties its output head to the embedding
    weight_bytes = sum(int(t.n_bytes) for t in reader.tensors)
    params = sum(int(t.n_elements) for t in reader.tensors)
    layers, hidden = meta("llama.block_count"), meta("llama.embedding_length")
    heads, kv_heads = meta("llama.attention.head_count"), meta("llama.attention.head_count_kv")
    step, kv = expected(weight_bytes, params, layers, heads, kv_heads, hidden // heads, H100,
                        launch_s=20e-6)
    p = make(tmp_path, "--gpu", "h100", "--model", GGUF, "--launch_overhead_us", "20")
    check_step(p["step"], step)
    assert p["kv_bytes_per_token"] == kv == 2 * 30 * 3 * 64 * 2
    # KV blocks: what 90% of 80 GB holds after the weights, in blocks of 16 tokens.
    assert p["kv_blocks"] == int((H100["mem"] * 0.9 - weight_bytes) // (kv * 16))
    assert p["source"] == "roofline" and p["format"] == "tandem-profile-v1"
    # Exactly the keys of the format (the simulator refuses others).
    assert set(p) == {"format", "model", "engine", "source", "step", "kv_bytes_per_token",
                      "block_size", "kv_blocks", "max_running", "token_budget", "notes"}
    # It is a profile `tandem sim` takes.
    sim.check_profile(p, "roofline profile")


def test_shape_from_flags_on_an_h200(tmp_path):
    # A Llama-3-8B-like shape in BF16: 8.03e9 parameters, 32 layers, 32 heads, 8 KV heads of 128.
    p = make(tmp_path, "--gpu", "h200", "--params", "8.03e9", "--layers", "32", "--hidden",
             "4096", "--kv_heads", "8", "--head_dim", "128", "--mfu", "0.4", "--mbu", "0.7",
             "--kv-blocks", "1000")
    step, kv = expected(8.03e9 * 2, 8.03e9, 32, 32, 8, 128, H200, mfu=0.4, mbu=0.7)
    check_step(p["step"], step)
    assert kv == 131072 and p["kv_bytes_per_token"] == kv and p["kv_blocks"] == 1000
    # Base: the 16.06 GB of weights read at 70% of 4.8 TB/s, 4.78 ms.
    assert p["step"]["base_seconds"] == pytest.approx(4.78e-3, rel=1e-3)


def test_figures_beat_the_preset(tmp_path):
    p = make(tmp_path, "--gpu", "h100", "--flops", "1e15", "--mem_bw_gbps", "1000",
             "--params", "1e9", "--layers", "16", "--hidden", "2048", "--kv_heads", "4",
             "--head_dim", "64", "--dtype", "fp8", "--kv_dtype", "fp8")
    step, kv = expected(1e9, 1e9, 16, 32, 4, 64, {"flops": 1e15, "bw": 1e12}, kv_bytes=1)
    check_step(p["step"], step)
    assert p["kv_blocks"] == int((80e9 * 0.9 - 1e9) // (kv * 16))  # the preset's memory


def test_hugging_face_folder(tmp_path):
    """A folder of config.json and weights written by PyPI's safetensors (in .venv-hf)."""
    python = HF_VENV / "bin" / "python"
    if not python.exists():
        pytest.fail(f"{python} missing: scripts/setup.sh makes it")
    folder = tmp_path / "hf"
    folder.mkdir()
    shapes = {"model.embed_tokens.weight": (100, 32), "lm_head.weight": (100, 32),
              "model.layers.0.self_attn.q_proj.weight": (32, 32),
              "model.layers.0.self_attn.k_proj.weight": (16, 32),
              "model.layers.0.mlp.up_proj.weight": (64, 32)}
    script = ("import numpy as np, sys\nfrom safetensors.numpy import save_file\n"
              f"save_file({{k: np.zeros(s, dtype=np.float16) for k, s in {shapes!r}.items()}}, "
              "sys.argv[1])\n")
    subprocess.run([str(python), "-c", script, str(folder / "model.safetensors")], check=True,
                   timeout=120)
    (folder / "config.json").write_text(json.dumps(
        {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
         "num_hidden_layers": 1, "torch_dtype": "float16"}))
    p = make(tmp_path, "--flops", "1e12", "--mem_bw_gbps", "100", "--model", folder,
             "--kv_blocks", "10")
    params = sum(a * b for a, b in shapes.values())
    # The embedding is a lookup; the untied lm_head is a product.
    step, kv = expected(2 * params, params - 3200, 1, 4, 2, 8, {"flops": 1e12, "bw": 1e11})
    check_step(p["step"], step)
    assert kv == 2 * 1 * 2 * 8 * 2


@pytest.mark.parametrize("args,message", [
    (["--params", "1e9"], "give --gpu"),
    (["--gpu", "h100", "--params", "1e9"], "without --model, give the model's shape: --layers"),
    (["--gpu", "h100", "--model", "/nonexistent.gguf"], "does not exist"),
    (["--gpu", "h100", "--model", str(GGUF), "--layers", "3"], "leave out --layers"),
    (["--gpu", "h100", "--params", "1e9", "--layers", "1", "--hidden", "64", "--kv_heads", "1",
      "--head_dim", "64", "--dtype", "q3"], "--dtype 'q3'"),
    (["--gpu", "h100", "--params", "1e12", "--layers", "1", "--hidden", "64", "--kv_heads", "1",
      "--head_dim", "64"], "leave no room for KV"),
    (["--gpu", "tpu", "--params", "1e9"], "invalid choice: 'tpu'"),
    (["--gpu", "h100", "--mfu", "1.5", "--params", "1e9"], "must be in (0, 1]"),
])
def test_bad_input_is_named(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as info:
        profile.main(["--roofline", "--out", str(tmp_path / "p.json"), *args])
    assert info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "p.json").exists()
