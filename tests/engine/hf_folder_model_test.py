"""A Hugging Face model folder served as a model: `tandem generate --model=DIR` and logits_tool on a
folder of config.json, sharded *.safetensors with model.safetensors.index.json (F16, BF16, F32),
tokenizer.json written by PyPI `tokenizers` (the default model's vocabulary and merges) and
tokenizer_config.json, against the same weights written as an F32 GGUF with the `gguf` package
(the default model's tokenizer metadata) and loaded through the GGUF path. The folder's values are
the GGUF's exactly (F16 / BF16 rounded first), so both must agree as two F32 runs do: max |dlogit|
<= 1e-5 * (1 + max |logit|), same greedy continuation, same generated text. Missing pieces must be
refused naming the missing file.

Needs tandem and logits_tool (TANDEM_BIN_DIR) and the default model (TANDEM_SOURCE_DIR/models).
"""
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

from random_models_test import (SHAPES, TOKENIZER_KEYS, bf16_round, check_logits, random_weights,
                                write_gguf)
from reference_common import BIN, DEFAULT_MODEL, tandem

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "tokenizer"))
from tokenizer_reference_test import hf_byte_level, read_gguf_vocab  # noqa: E402

import gguf  # noqa: E402

SHAPE = next(s for s in SHAPES if s.arch == "llama" and s.kv_heads < s.heads)


def tokenizer_metadata():
    reader = gguf.GGUFReader(DEFAULT_MODEL)
    out = []
    for key in TOKENIZER_KEYS:
        field = reader.get_field(key)
        sub_type = field.types[1] if len(field.types) > 1 else None
        out.append((key, field.contents(), field.types[0], sub_type))
    return out


def stored(w, dtype):
    """(bytes in `dtype`, the float32 values they hold)."""
    if dtype == "F16":
        h = w.astype(np.float16)
        return h.tobytes(), h.astype(np.float32)
    if dtype == "BF16":
        b = bf16_round(w)
        return b.tobytes(), (b.astype(np.uint32) << 16).view(np.float32)
    return w.astype(np.float32).tobytes(), w.astype(np.float32)


def write_shards(directory, weights, dtype, shards):
    """`shards` safetensors files and model.safetensors.index.json (or model.safetensors alone);
    returns the float32 values stored."""
    names = list(weights)
    values, weight_map = {}, {}
    for k in range(shards):
        part = names[k::shards]
        file = (f"model-{k + 1:05d}-of-{shards:05d}.safetensors" if shards > 1
                else "model.safetensors")
        header, blobs, offset = {}, [], 0
        for name in part:
            data, values[name] = stored(weights[name], dtype)
            header[name] = {"dtype": dtype, "shape": list(weights[name].shape),
                            "data_offsets": [offset, offset + len(data)]}
            blobs.append(data)
            offset += len(data)
            weight_map[name] = file
        text = json.dumps(header).encode()
        text += b" " * (-(8 + len(text)) % 8)
        with open(directory / file, "wb") as f:
            f.write(len(text).to_bytes(8, "little"))
            f.write(text)
            for blob in blobs:
                f.write(blob)
    if shards > 1:
        (directory / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return values


def write_hf_folder(directory, weights, dtype, shards, vocab):
    directory.mkdir()
    s = SHAPE
    (directory / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "vocab_size": len(vocab["tokens"]),
        "hidden_size": s.hidden, "intermediate_size": s.ffn, "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads, "num_key_value_heads": s.kv_heads, "head_dim": s.head_dim,
        "max_position_embeddings": 2048, "rms_norm_eps": s.rms_eps, "rope_theta": s.rope_theta,
        "tie_word_embeddings": s.tied, "torch_dtype": "float32"}))
    hf_byte_level(vocab, "smollm").save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": vocab["tokens"][vocab["bos"]], "eos_token": vocab["tokens"][vocab["eos"]],
        "add_bos_token": False, "chat_template": vocab["chat_template"]}))
    return write_shards(directory, weights, dtype, shards)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """{dtype: (HF folder, F32 GGUF of the same values)}."""
    if not DEFAULT_MODEL.exists():
        pytest.fail(f"{DEFAULT_MODEL} missing: scripts/setup.sh downloads it")
    root = tmp_path_factory.mktemp("hf_folder")
    vocab = read_gguf_vocab(DEFAULT_MODEL)
    metadata = tokenizer_metadata()
    weights = random_weights(SHAPE, len(vocab["tokens"]), seed=31)
    out = {}
    for dtype, shards in (("F16", 3), ("BF16", 2), ("F32", 1)):
        folder = root / f"hf-{dtype}"
        values = write_hf_folder(folder, weights, dtype, shards, vocab)
        ref = root / f"{dtype}.gguf"
        write_gguf(str(ref), SHAPE, values, "F32", metadata)
        out[dtype] = (folder, ref)
    return out


def generate(model, prompt, *extra):
    p = subprocess.run([str(BIN / "tandem"), "generate", f"--model={model}", f"--prompt={prompt}",
                        "--max_tokens=24", "--temperature=0", "--kv_dtype=f32", *extra],
                       capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


@pytest.mark.parametrize("dtype", ["F16", "BF16", "F32"])
def test_logits_match_gguf_of_same_values(models, dtype, tmp_path):
    folder, ref = models[dtype]
    tokens = np.random.default_rng(7).integers(0, 49152, 48).tolist()
    ours, ours_greedy = tandem(folder, tokens, 8, tmp_path, kv_dtype="f32")
    gguf_logits, gguf_greedy = tandem(ref, tokens, 8, tmp_path, kv_dtype="f32")
    print(dtype, check_logits(ours, gguf_logits, "F32"))
    assert ours_greedy == gguf_greedy


@pytest.mark.parametrize("chat", [False, True])
def test_generate_on_folder_matches_gguf(models, chat):
    folder, ref = models["F16"]
    extra = ["--chat"] if chat else []
    prompt = "Bonjour! Wie geht's? 你好 — def f(x): return x"
    rc, from_folder, err = generate(folder, prompt, *extra)
    assert rc == 0, err
    rc, from_gguf, err = generate(ref, prompt, *extra)
    assert rc == 0, err
    assert from_folder == from_gguf and from_folder


def test_missing_pieces_are_named(models, tmp_path):
    folder, _ = models["F16"]
    for missing in ("config.json", "tokenizer.json", "model-00002-of-00003.safetensors"):
        broken = tmp_path / missing
        shutil.copytree(folder, broken)
        (broken / missing).unlink()
        rc, _, err = generate(broken, "hi")
        assert rc != 0 and missing in err, err
    rc, _, err = generate(tmp_path / "no-such-model", "hi")
    assert rc != 0 and "no-such-model" in err, err


def test_cluster_serves_the_folder(models):
    """`tandem up --model=DIR`: router, prefill and decode worker all on the folder; the cluster's
    greedy text equals `tandem generate` in one process on the same folder."""
    folder, _ = models["F16"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    p = subprocess.Popen([str(BIN / "tandem"), "up", f"--model={folder}", "--http_port=0",
                          "--grpc_port=0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, env=env)
    lines, grpc_address = [], None
    try:
        for line in p.stdout:
            lines.append(line)
            if "gRPC API:" in line:
                grpc_address = line.split("gRPC API:")[1].split()[0]
            if "Ctrl-C stops the cluster" in line:
                break
        assert grpc_address, "".join(lines)
        prompt = "Hallo Welt, 你好"
        remote = subprocess.run([str(BIN / "tandem"), "generate", f"--url={grpc_address}",
                                 f"--prompt={prompt}", "--max_tokens=12"],
                                capture_output=True, text=True, timeout=120)
        assert remote.returncode == 0, remote.stderr
        local = subprocess.run([str(BIN / "tandem"), "generate", f"--model={folder}",
                                f"--prompt={prompt}", "--max_tokens=12", "--threads=1"],
                               capture_output=True, text=True, timeout=120)
        assert local.returncode == 0, local.stderr
        assert remote.stdout == local.stdout, (remote, local)
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)
        assert p.returncode == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
