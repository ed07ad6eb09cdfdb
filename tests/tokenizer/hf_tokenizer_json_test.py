"""Tandem's tokenizer.json reader (engine/tokenizer/hf_tokenizer.h) against Hugging Face `tokenizers`.

Every tokenizer.json here is written by the `tokenizers` library at test time: byte-level BPEs
(GPT-2, Llama 3 and Qwen2 pre-tokenizers) and SentencePiece-style BPEs with byte fallback
(Metaspace "first" and "always", and the Prepend + Replace normalizers of older Llama exports)
trained on a multilingual corpus, plus the default model's vocabulary and merges exported as
tokenizer.json. tokenize_tool --hf=DIR must give the same ids as `tokenizers` (with and without
special tokens) and decode them to the same text.

Needs tokenize_tool (TANDEM_BIN_DIR) and the default model (TANDEM_SOURCE_DIR/models).
"""
import json
import os
import pathlib
import subprocess
import sys
import unicodedata

import pytest
import tokenizers
from tokenizers import (AddedToken, Regex, decoders, models, normalizers, pre_tokenizers,
                        processors, trainers)

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from tokenizer_reference_test import (CORPUS, LLAMA3_REGEX, MODEL, QWEN2_REGEX,  # noqa: E402
                                      RANDOM_CORPUS, TOOL, hf_byte_level, read_gguf_vocab)

GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

TRAIN_TEXT = [
    "The quick brown fox jumps over the lazy dog. It's a truly wonderful day, isn't it?",
    "Die Straße ist nass, weil es gestern den ganzen Tag geregnet hat. Übermäßig schön!",
    "Le café est très chaud ; nous allons à la plage où les élèves étudient.",
    "Привет, мир! Как дела? Сегодня мы тестируем токенизатор на русском языке.",
    "Γειά σου κόσμε! Η γλώσσα μας είναι πολύ όμορφη και παλιά.",
    "你好，世界！今天我们测试一个分词器。中文没有空格。",
    "こんにちは世界。今日はトークナイザーをテストします。ひらがなとカタカナ。",
    "안녕하세요 세계! 오늘은 토크나이저를 테스트합니다.",
    "مرحبا بالعالم! نحن نختبر المقسم اليوم باللغة العربية.",
    "नमस्ते दुनिया! आज हम हिंदी में टोकनाइज़र का परीक्षण कर रहे हैं।",
    "Emoji time: 😀😀 👍🏽 ❤️ 🇰🇷 👨‍👩‍👧‍👦 🚀✨",
    "def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(add(i, i * 2))\n",
    "int main() {\n\tstd::vector<int> v{1, 2, 3};\n\treturn 0;\n}\n",
    "Whitespace   runs\t\tand\n\n\nnewlines    everywhere     here.",
    "Numbers 0 12 345 6789 3.14159 2024-06-01 1,000,000",
]
TRAIN_CORPUS = [t for t in TRAIN_TEXT for _ in range(4)] + CORPUS

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

TEST_CORPUS = TRAIN_TEXT + CORPUS + RANDOM_CORPUS[:200] + [
    "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n",
    "Unseen: Ωμέγα ∮ ⅞ 🦜 ᚠᛇᚻ ꙮ \U00010348 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "  leading spaces and <|im_end|>   around specials <|endoftext|>  ",
]

# Text that Unicode NFC changes: decomposed letters (NFD of the multilingual lines), combining
# marks out of canonical order, Hangul as conjoining jamo, singletons (Ohm, Angstrom, CJK
# compatibility ideographs), marks after special tokens, and compatibility forms NFC keeps.
NOT_NFC = [d for d in (unicodedata.normalize("NFD", t) for t in TRAIN_TEXT)
           if unicodedata.normalize("NFC", d) != d] + [
    "Vie\u0323\u0302t Nam: Tie\u0302\u0301ng Vie\u0323\u0302t co\u0301 da\u0302\u0301u",
    "a\u0301\u0323 vs a\u0323\u0301, q\u0307\u0323, e\u0308\u0304\u0301",
    "\u1100\u1161\u11a8 \u1112\u1161\u11ab\u1100\u1173\u11af",
    "\u2126hm \u212b ngstr\u00f6m \uf900\uf901 \u2fa1d",
    "<|im_start|>\u0301user\ne\u0301<|im_end|>\u0308",
    "\u0915\u093c \u0928\u093c \u09a1\u09bc\u09c7\u09be \u0b47\u0b3e \u0dd9\u0dcf",
    "\ufb01ne \u2460 \uff21\uff22 \u00bd stay: compatibility forms are NFKC's business",
]
assert all(unicodedata.normalize("NFC", t) != t for t in NOT_NFC[:-1])


def run_tool(args, payload):
    assert TOOL.exists(), f"{TOOL} is missing; build the tokenize_tool target"
    proc = subprocess.run([str(TOOL), *args], input=json.dumps(payload).encode(),
                          capture_output=True, timeout=300)
    return proc.returncode, json.loads(proc.stdout.decode()), proc.stderr.decode()


def write_folder(path, tokenizer_json, config=None):
    path.mkdir(parents=True, exist_ok=True)
    (path / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    if config is not None:
        (path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return path


def string_merges(tokenizer_json):
    """The same tokenizer.json with merges in the older "a b" string form."""
    j = json.loads(tokenizer_json)
    j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    return json.dumps(j, ensure_ascii=False)


def check_against(folder, hf, texts, spm=False):
    """Ours (tokenize_tool --hf=folder) and `hf` agree on ids and decoded text."""
    for add_special in (False, True):
        args = [f"--hf={folder}"] + (["--add-special"] if add_special else [])
        rc, ours, err = run_tool(args, texts)
        assert rc == 0, err
        mismatches = []
        for text, got in zip(texts, ours):
            want = hf.encode(text, add_special_tokens=add_special).ids
            if got["ids"] != want:
                mismatches.append((text, got["ids"], want))
            else:
                # Decode() drops the SentencePiece dummy prefix of the first text token also after
                # a leading BOS (as sentencepiece does); Hugging Face keeps it there.
                decoded = hf.decode(want, skip_special_tokens=False)
                if want and spm and want[0] == hf.token_to_id("<s>"):
                    decoded = "<s>" + hf.decode(want[1:], skip_special_tokens=False)
                if got["decoded"] != decoded:
                    mismatches.append((text, got["decoded"], decoded))
        assert not mismatches, f"{len(mismatches)} of {len(texts)} differ; first: {mismatches[0]!r}"


def train_byte_level(pre, *, normalizer=None, ignore_merges=False, bos=None):
    tk = tokenizers.Tokenizer(models.BPE())
    if pre == "gpt2":
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pre), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if normalizer is not None:
        tk.normalizer = normalizer
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=SPECIALS + ([bos] if bos else []),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tk.train_from_iterator(TRAIN_CORPUS, trainer)
    if bos:
        tk.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", special_tokens=[(bos, tk.token_to_id(bos))])
    j = json.loads(tk.to_str())
    j["model"]["ignore_merges"] = ignore_merges
    text = json.dumps(j, ensure_ascii=False)
    return text, tokenizers.Tokenizer.from_str(text)


@pytest.mark.parametrize("variant", ["gpt2", "llama3", "qwen2-nfc"])
def test_trained_byte_level(tmp_path, variant):
    if variant == "gpt2":
        text, hf = train_byte_level("gpt2")
    elif variant == "llama3":
        text, hf = train_byte_level(LLAMA3_REGEX, ignore_merges=True, bos="<|begin_of_text|>")
    else:
        text, hf = train_byte_level(QWEN2_REGEX, normalizer=normalizers.NFC())
    texts = TEST_CORPUS
    if variant == "qwen2-nfc":  # text that NFC changes, and must be tokenized as Hugging Face does
        texts = texts + NOT_NFC
        assert sum(unicodedata.normalize("NFC", t) != t for t in texts) >= len(NOT_NFC)
    check_against(write_folder(tmp_path / "pairs", text), hf, texts)
    check_against(write_folder(tmp_path / "strings", string_merges(text)), hf, texts)


def spm_tokenizer_json(style):
    """A SentencePiece-style BPE with byte fallback, laid out as Llama 2's: <unk> <s> </s>, the 256
    byte tokens, then the learned vocabulary."""
    tk = tokenizers.Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=["<unk>", "<s>", "</s>"],
                                  show_progress=False, max_token_length=16)
    tk.train_from_iterator(TRAIN_CORPUS, trainer)
    trained = json.loads(tk.to_str())
    learned = sorted(trained["model"]["vocab"].items(), key=lambda kv: kv[1])
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [t for t, _ in learned if t not in tokens]
    vocab = {t: i for i, t in enumerate(tokens)}
    j = trained
    j["model"]["vocab"] = vocab
    j["added_tokens"] = [
        {"id": vocab[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True} for t in ("<unk>", "<s>", "</s>")]
    # A user-defined (non-special) added token with rstrip, and a special with lstrip.
    tokens_extra = [("<tool>", False, False, True), ("<|im_end|>", True, True, False)]
    for content, special, lstrip, rstrip in tokens_extra:
        vocab.setdefault(content, len(vocab))
        j["added_tokens"].append({"id": vocab[content], "content": content, "single_word": False,
                                  "lstrip": lstrip, "rstrip": rstrip, "normalized": False,
                                  "special": special})
    j["decoder"] = json.loads(decoders.Sequence([
        decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
        decoders.Strip(" ", 1, 0)]).__getstate__())
    j["post_processor"] = json.loads(processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 1)]).__getstate__())
    if style == "metaspace-first":
        j["normalizer"] = None
        j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first",
                              "split": False}
    elif style == "metaspace-always":
        j["normalizer"] = None
        j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always",
                              "split": True}
    else:  # legacy Llama 2 export
        j["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
        j["pre_tokenizer"] = None
    return json.dumps(j, ensure_ascii=False)


@pytest.mark.parametrize("style", ["metaspace-first", "metaspace-always", "prepend-replace"])
def test_trained_sentencepiece_bpe(tmp_path, style):
    text = spm_tokenizer_json(style)
    hf = tokenizers.Tokenizer.from_str(text)
    texts = TEST_CORPUS + ["<tool>   after the tool", "before  <|im_end|>after", "<s>x</s>"]
    config = {"bos_token": "<s>", "eos_token": {"content": "</s>"}, "add_bos_token": True,
              "chat_template": [{"name": "tool_use", "template": "T"},
                                {"name": "default", "template": "{{ bos_token }}D"}]}
    folder = write_folder(tmp_path / style, text, config)
    check_against(folder, hf, texts, spm=True)
    check_against(write_folder(tmp_path / "strings", string_merges(text), config), hf, texts,
                  spm=True)
    rc, info, err = run_tool([f"--hf={folder}", "--hf-info"], [])
    assert rc == 0, err
    assert info == {"bos": hf.token_to_id("<s>"), "eos": hf.token_to_id("</s>"), "add_bos": True,
                    "chat_template": "{{ bos_token }}D"}


def gemma_tokenizer_json():
    """Laid out as Gemma's tokenizer.json: <pad> <eos> <bos> <unk>, the 256 byte tokens, then a
    BPE with byte fallback learned with no pre-tokenizer (pieces may span words) over the
    normalizer Replace(" " -> "▁") alone: no dummy prefix, and a decoder without Strip."""
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    tk = tokenizers.Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tk.normalizer = normalizers.Replace(" ", "▁")
    trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=specials, show_progress=False,
                                  max_token_length=16)
    tk.train_from_iterator(TRAIN_CORPUS, trainer)
    j = json.loads(tk.to_str())
    learned = sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1])
    tokens = specials + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [t for t, _ in learned if t not in tokens]
    j["model"]["vocab"] = {t: i for i, t in enumerate(tokens)}
    j["added_tokens"] = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True} for i, t in enumerate(specials)]
    j["pre_tokenizer"] = None
    j["decoder"] = json.loads(decoders.Sequence([
        decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]).__getstate__())
    j["post_processor"] = json.loads(processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", 2)]).__getstate__())
    return json.dumps(j, ensure_ascii=False)


def test_trained_gemma_style(tmp_path):
    text = gemma_tokenizer_json()
    hf = tokenizers.Tokenizer.from_str(text)
    # Pieces that span words, and characters the training never saw (byte fallback).
    assert any("▁" in t[1:] for t in hf.get_vocab())
    texts = TEST_CORPUS + ["  two leading spaces", "trailing  ", "<bos>x<eos>", "☃ snow ❄"]
    config = {"bos_token": "<bos>", "eos_token": "<eos>", "add_bos_token": True}
    folder = write_folder(tmp_path / "gemma", text, config)
    check_against(folder, hf, texts)
    assert any(t.startswith("<0x") for t in hf.encode("☃ snow ❄").tokens)
    rc, info, err = run_tool([f"--hf={folder}", "--hf-info"], [])
    assert rc == 0, err
    assert (info["bos"], info["eos"], info["add_bos"]) == (2, 1, True)


def test_default_model_exported(tmp_path):
    """The default model's vocabulary and merges, exported by `tokenizers` as tokenizer.json."""
    if not MODEL.exists():
        pytest.fail(f"{MODEL} missing: scripts/setup.sh downloads it")
    vocab = read_gguf_vocab(MODEL)
    hf = hf_byte_level(vocab, "smollm")
    folder = tmp_path / "smollm2"
    folder.mkdir()
    hf.save(str(folder / "tokenizer.json"))
    tokens = vocab["tokens"]
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": tokens[vocab["bos"]], "eos_token": tokens[vocab["eos"]],
        "add_bos_token": False, "chat_template": vocab["chat_template"]}))
    check_against(folder, hf, CORPUS + RANDOM_CORPUS)
    rc, info, err = run_tool([f"--hf={folder}", "--hf-info"], [])
    assert rc == 0, err
    assert info["chat_template"] == vocab["chat_template"]
    assert (info["bos"], info["eos"]) == (vocab["bos"], vocab["eos"])
    # The chat renders through the model's own template, as from the GGUF.
    chat = {"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": True}
    rc_hf, from_hf, err = run_tool([f"--hf={folder}", "--chat"], chat)
    assert rc_hf == 0, err
    rc_gguf, from_gguf, err = run_tool([f"--model={MODEL}", "--chat"], chat)
    assert rc_gguf == 0, err
    assert from_hf == from_gguf


def refused(folder):
    rc, out, _ = run_tool([f"--hf={folder}"], ["x"])
    assert rc == 1
    return out


def test_unsupported_and_bad_files(tmp_path):
    wp = tokenizers.Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    out = refused(write_folder(tmp_path / "wordpiece", wp.to_str()))
    assert out["error"] == "UNIMPLEMENTED" and "WordPiece" in out["message"]

    uni = tokenizers.Tokenizer(models.Unigram([("<unk>", 0.0), ("a", -1.0)], 0))
    out = refused(write_folder(tmp_path / "unigram", uni.to_str()))
    assert out["error"] == "UNIMPLEMENTED" and "Unigram" in out["message"]

    text, _ = train_byte_level("gpt2")
    j = json.loads(text)
    j["pre_tokenizer"] = {"type": "Whitespace"}
    out = refused(write_folder(tmp_path / "whitespace", json.dumps(j)))
    assert out["error"] == "UNIMPLEMENTED" and "Whitespace" in out["message"]

    j = json.loads(text)
    j["pre_tokenizer"] = json.loads(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\w+|\s+"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]).__getstate__())
    out = refused(write_folder(tmp_path / "regex", json.dumps(j)))
    assert out["error"] == "UNIMPLEMENTED" and r"\w+|\s+" in out["message"]

    out = refused(tmp_path / "nowhere")
    assert out["error"] == "NOT_FOUND" and "tokenizer.json" in out["message"]

    # Truncated and mistyped files: a clear INVALID_ARGUMENT, never a crash.
    for i, bad in enumerate([text[: len(text) // 2], "[]", '{"model": 3}',
                             text.replace('"vocab":', '"vocab": 7, "x":', 1),
                             text.replace('"merges": [', '"merges": [42, ', 1)]):
        out = refused(write_folder(tmp_path / f"bad{i}", bad))
        assert out["error"] == "INVALID_ARGUMENT", out
