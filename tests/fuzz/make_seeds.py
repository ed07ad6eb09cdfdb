"""Writes the generated seeds of tests/fuzz/corpus/ (the hand-written ones sit beside them):

  gguf/          tiny GGUF files made by gguf-py (llama.cpp's own writer): a Llama-architecture
                 model with a byte-level BPE vocabulary, one with a SentencePiece vocabulary, and
                 every metadata value type.
  hf_tokenizer/  tokenizer.json files made by Hugging Face `tokenizers`: byte-level BPE and
                 SentencePiece-style BPE with byte fallback, each with a tokenizer_config.json
                 after a NUL byte (hf_tokenizer_fuzz.cc's input format).

Run with the project's .venv (gguf, tokenizers, numpy): .venv/bin/python tests/fuzz/make_seeds.py
The files are committed; this says how they were made and remakes them.
"""
import json
import pathlib

import gguf
import numpy as np
from tokenizers import (AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                        trainers)

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


if __name__ == "__main__":
    write_hf_tokenizers()
    write_ggufs()
