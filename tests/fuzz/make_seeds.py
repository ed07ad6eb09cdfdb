"""Writes the generated seeds of tests/fuzz/corpus/ (the hand-written ones sit beside them):

  gguf/          tiny GGUF files made by gguf-py (llama.cpp's own writer): a Llama-architecture
                 model with a byte-level BPE vocabulary, one with a SentencePiece vocabulary, and
                 every metadata value type.
  hf_tokenizer/  tokenizer.json files made by Hugging Face `tokenizers`: byte-level BPE and
                 SentencePiece-style BPE with byte fallback, each with a tokenizer_config.json
                 after a NUL byte (hf_tokenizer_fuzz.cc's input format).

  proto_conversion/, worker_view/, kv_descriptor/
                 serialized tandem.v1 messages made by Python protobuf from proto/tandem/v1
                 (worker_view: WorkerStateUpdate messages, each after its 2-byte little-endian
                 length).
  safetensors/, hf_config/ (with --hf)
                 safetensors files made by the `safetensors` library, and the config.json of
                 each supported architecture as transformers' config classes write it.

Run with the project's .venv (gguf, tokenizers, numpy, grpcio-tools):
  .venv/bin/python tests/fuzz/make_seeds.py
and with .venv-hf (transformers, safetensors, torch) for the rest:
  .venv-hf/bin/python tests/fuzz/make_seeds.py --hf
The files are committed; this says how they were made and remakes them.
"""
import sys
import json
import pathlib

import numpy as np

CORPUS = pathlib.Path(__file__).parent / "corpus"
TEXT = ["The quick brown fox jumps over the lazy dog.", "Die Straße ist nass. Übermäßig!",
        "你好，世界！", "print('hello')  # 123 456", "Привет, мир!"] * 4


def byte_level_vocab(size=300):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXT, trainers.BpeTrainer(
        vocab_size=size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], show_progress=False))
    return tok


def sentencepiece_vocab(size=120):
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.train_from_iterator(TEXT, trainers.BpeTrainer(
        vocab_size=size, special_tokens=["<unk>", "<s>", "</s>"] +
        [f"<0x{b:02X}>" for b in range(256)], show_progress=False))
    tok.add_special_tokens([AddedToken("<|user|>", special=True)])
    return tok


def write_hf_tokenizers():
    out = CORPUS / "hf_tokenizer"
    out.mkdir(parents=True, exist_ok=True)
    configs = {
        "byte_level": {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
                       "chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n"
                                        "{{ m.content }}<|im_end|>\n{% endfor %}"},
        "sentencepiece": {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True},
    }
    for name, tok in (("byte_level", byte_level_vocab()), ("sentencepiece", sentencepiece_vocab())):
        text = tok.to_str()
        (out / f"{name}.json").write_text(text)
        (out / f"{name}_with_config.json").write_bytes(
            text.encode() + b"\0" + json.dumps(configs[name]).encode())


def tensor_data(writer, n_embd, n_vocab, n_ff):
    shapes = {"token_embd.weight": (n_vocab, n_embd), "output_norm.weight": (n_embd,),
              "blk.0.attn_norm.weight": (n_embd,), "blk.0.ffn_norm.weight": (n_embd,),
              "blk.0.attn_q.weight": (n_embd, n_embd), "blk.0.attn_k.weight": (n_embd, n_embd),
              "blk.0.attn_v.weight": (n_embd, n_embd), "blk.0.attn_output.weight": (n_embd, n_embd),
              "blk.0.ffn_gate.weight": (n_ff, n_embd), "blk.0.ffn_up.weight": (n_ff, n_embd),
              "blk.0.ffn_down.weight": (n_embd, n_ff)}
    for name, shape in shapes.items():
        writer.add_tensor(name, np.full(shape, 0.01, dtype=np.float32))


def write_gguf(path, vocab):
    n_embd, n_ff = 8, 16
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(64)
    w.add_embedding_length(n_embd)
    w.add_block_count(1)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    tokens, scores, types, merges = vocab
    w.add_tokenizer_model("gpt2" if merges else "llama")
    if merges:
        w.add_tokenizer_pre("smollm")
        w.add_token_merges(merges)
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>"
                        "assistant\n{% endif %}")
    tensor_data(w, n_embd, len(tokens), n_ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def byte_level_gguf_vocab():
    tok = json.loads(byte_level_vocab(280).to_str())
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    tokens = [t for t, _ in vocab]
    specials = {a["content"] for a in tok["added_tokens"]}
    types = [3 if t in specials else 1 for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    return tokens, [0.0] * len(tokens), types, merges


def sentencepiece_gguf_vocab():
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + \
        ["▁", "▁t", "he", "▁the", "▁a", "o", "e", "t", "h", "a"]
    types = [2, 3, 3] + [6] * 256 + [1] * 10
    scores = [0.0] * 259 + [-float(i) for i in range(10)]
    return tokens, scores, types, []


def write_ggufs():
    out = CORPUS / "gguf"
    out.mkdir(parents=True, exist_ok=True)
    write_gguf(out / "llama_byte_level.gguf", byte_level_gguf_vocab())
    write_gguf(out / "llama_sentencepiece.gguf", sentencepiece_gguf_vocab())
    # Every metadata value type, arrays of arrays included, and no tensors.
    w = gguf.GGUFWriter(str(out / "value_types.gguf"), "llama")
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -2000000000)
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_float32("t.f32", 1.5)
    w.add_float64("t.f64", -2.25)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo")
    w.add_array("t.arr_i32", [1, -2, 3])
    w.add_array("t.arr_str", ["a", "bc", ""])
    w.add_array("t.arr_arr", [[1, 2], [3]])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def proto_modules():
    import importlib
    import subprocess
    import tempfile
    root = pathlib.Path(__file__).resolve().parents[2] / "proto"
    out = tempfile.mkdtemp()
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{root}", f"--python_out={out}",
                    "tandem/v1/inference.proto", "tandem/v1/worker.proto"], check=True)
    sys.path.insert(0, out)
    return (importlib.import_module("tandem.v1.inference_pb2"),
            importlib.import_module("tandem.v1.worker_pb2"))


def write_protos():
    inference, worker = proto_modules()
    out = CORPUS / "proto_conversion"
    out.mkdir(parents=True, exist_ok=True)
    r = inference.GenerateRequest(request_id="r1", model="m", prompt="Hello")
    r.sampling.temperature = 0.7
    r.sampling.top_p = 0.9
    r.sampling.top_k = 40
    r.sampling.max_tokens = 16
    r.sampling.stop.extend(["\n\n", "END"])
    (out / "prompt_sampling.pb").write_bytes(r.SerializeToString())
    r = inference.GenerateRequest(request_id="r2", model="m")
    r.token_ids.ids.extend([1, 2, 3])
    r.sampling.seed = 7
    r.sampling.min_tokens = 2
    r.sampling.stop_token_ids.extend([5, 6])
    r.sampling.logprobs = 3
    (out / "token_ids.pb").write_bytes(r.SerializeToString())
    fields = {f.name for f in inference.SamplingParams.DESCRIPTOR.fields}
    r = inference.GenerateRequest(request_id="r3", model="m", prompt="x")
    for name, value in (("frequency_penalty", 0.5), ("presence_penalty", -0.5),
                        ("repetition_penalty", 1.1), ("min_p", 0.05), ("ignore_eos", True)):
        if name in fields:
            setattr(r.sampling, name, value)
    (out / "penalties.pb").write_bytes(r.SerializeToString())

    def layout(message, layers=2, block=16, heads=2, dim=8, dtype=None):
        l = message.layout
        l.num_layers, l.block_size, l.num_kv_heads, l.head_dim = layers, block, heads, dim
        l.dtype = dtype if dtype is not None else inference.DTYPE_F32 \
            if hasattr(inference, "DTYPE_F32") else worker.DTYPE_F32
        l.block_bytes = 2 * block * heads * dim * 4
        l.layer_stride_bytes = l.block_bytes
        return l.block_bytes * layers

    out = CORPUS / "kv_descriptor"
    out.mkdir(parents=True, exist_ok=True)
    d = worker.KvPoolDescriptor(transport="ucx", transport_address=b"\x01\x02addr", pool_epoch=3)
    stride = layout(d)
    region = d.regions.add()
    region.base_address, region.length, region.remote_key = 0x7f0000000000, stride * 64, b"rkey"
    region.memory_type = worker.MEMORY_TYPE_HOST
    (out / "ucx_host.pb").write_bytes(d.SerializeToString())
    d = worker.KvPoolDescriptor(transport="inproc", transport_address=b"pool-1", pool_epoch=1)
    stride = layout(d, layers=30, block=16, heads=3, dim=64)
    for i in range(2):
        region = d.regions.add()
        region.base_address, region.length = 0x1000 + i * stride * 8, stride * 8
        region.memory_type = worker.MEMORY_TYPE_HOST
    (out / "inproc_two_regions.pb").write_bytes(d.SerializeToString())

    out = CORPUS / "worker_view"
    out.mkdir(parents=True, exist_ok=True)

    def frame(*updates):
        data = b""
        for u in updates:
            b = u.SerializeToString()
            data += len(b).to_bytes(2, "little") + b
        return data

    snap = worker.WorkerStateUpdate()
    s = snap.snapshot
    s.worker_id, s.model_id, s.role = "decode-0", "m", worker.ROLE_DECODE
    s.block_size, s.total_blocks, s.max_context, s.max_running = 16, 64, 2048, 8
    s.last_event_id = 10
    if "cached_block_hashes" in {f.name for f in type(s).DESCRIPTOR.fields}:
        s.cached_block_hashes.extend([11, 22, 33])
    layout(s.kv_pool)
    events = worker.WorkerStateUpdate()
    for i, kind in enumerate(e.name for e in events.kv_events.DESCRIPTOR.fields_by_name["events"]
                              .message_type.oneofs[0].fields):
        e = events.kv_events.events.add(event_id=11 + i)
        sub = getattr(e, kind)
        if hasattr(sub, "block_hashes"):
            sub.block_hashes.extend([44 + i, 55 + i])
        else:
            sub.SetInParent()
    load = worker.WorkerStateUpdate()
    load.load.running_seqs, load.load.free_blocks, load.load.draining = 3, 20, False
    step = load.load.recent_steps.add()
    for name, value in (("decode_tokens", 3), ("prompt_tokens", 16), ("elapsed_us", 900),
                        ("attended_tokens", 100), ("prompt_attended_tokens", 50)):
        if name in {f.name for f in type(step).DESCRIPTOR.fields}:
            setattr(step, name, value)
    (out / "snapshot_events_load.bin").write_bytes(frame(snap, events, load))
    gap = worker.WorkerStateUpdate()
    gap.kv_events.events.add(event_id=99)
    (out / "gap_then_snapshot.bin").write_bytes(frame(snap, gap, load, snap, events))


def write_hf_files():
    import safetensors.numpy
    import transformers
    out = CORPUS / "safetensors"
    out.mkdir(parents=True, exist_ok=True)
    safetensors.numpy.save_file({"a": np.arange(6, dtype=np.float32).reshape(2, 3),
                                 "b": np.zeros((0, 4), dtype=np.float16),
                                 "scalar": np.array(1.5, dtype=np.float64)},
                                str(out / "mixed.safetensors"), metadata={"format": "pt"})
    safetensors.numpy.save_file({"model.embed_tokens.weight": np.ones((4, 8), dtype=np.float16),
                                 "model.norm.weight": np.ones(8, dtype=np.float32),
                                 "i8": np.arange(5, dtype=np.int8)},
                                str(out / "model.safetensors"))
    out = CORPUS / "hf_config"
    out.mkdir(parents=True, exist_ok=True)
    small = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    for name in ("LlamaConfig", "MistralConfig", "Qwen2Config", "Qwen3Config", "Phi3Config",
                 "GemmaConfig", "Gemma2Config", "Gemma3TextConfig"):
        if not hasattr(transformers, name):
            continue  # an older transformers (Qwen3, Gemma 3 came later)
        config = getattr(transformers, name)(**small)
        arch = name.replace("TextConfig", "Config").replace("Config", "ForCausalLM")
        config.architectures = [arch]
        (out / f"{name}.json").write_text(config.to_json_string())
    config = transformers.LlamaConfig(**small, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 128}, architectures=["LlamaForCausalLM"])
    (out / "llama3_rope.json").write_text(config.to_json_string())


if __name__ == "__main__":
    if sys.argv[1:] == ["--hf"]:
        write_hf_files()
    else:
        import gguf
        from tokenizers import (AddedToken, Tokenizer, decoders, models, normalizers,
                                pre_tokenizers, trainers)
        globals().update(gguf=gguf, AddedToken=AddedToken, Tokenizer=Tokenizer,
                         decoders=decoders, models=models, normalizers=normalizers,
                         pre_tokenizers=pre_tokenizers, trainers=trainers)
        write_hf_tokenizers()
        write_ggufs()
        write_protos()
