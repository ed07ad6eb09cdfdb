"""Tandem's tokenizer against reference implementations.

* Byte-level BPE: the default model's GGUF (SmolLM2, pre-tokenizer "smollm") against a Hugging
  Face `tokenizers` BPE built from the same vocabulary and merges with SmolLM2's pre-tokenizer
  (Digits(individual) + ByteLevel); the same vocabulary re-labelled "gpt2" and "llama-bpe" (Llama 3
  regex, ignore_merges) in generated GGUF files against the matching HF pipelines.
* SentencePiece BPE: a small model trained here with `sentencepiece` (byte fallback), written to a
  Llama-style GGUF with gguf-py, against sentencepiece's own encoder.
* Chat templates: tokenize_tool --chat against jinja2 rendering of the real templates.

Needs tokenize_tool (TANDEM_BIN_DIR) and the default model (TANDEM_SOURCE_DIR/models).
"""
import json
import os
import pathlib
import random
import subprocess
import sys

import gguf
import jinja2
import jinja2.sandbox
import pytest
import sentencepiece as spm
import tokenizers
from tokenizers import AddedToken, decoders, models, pre_tokenizers

SOURCE_DIR = pathlib.Path(os.environ.get("TANDEM_SOURCE_DIR", pathlib.Path(__file__).parents[2]))
BIN_DIR = pathlib.Path(os.environ.get("TANDEM_BIN_DIR", SOURCE_DIR / "build/release/bin"))
TOOL = BIN_DIR / "tokenize_tool"
MODEL = SOURCE_DIR / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = LLAMA3_REGEX.replace(r"\p{N}{1,3}", r"\p{N}")

CORPUS = [
    "",
    " ",
    "Hello world",
    "Hello, world! How are you doing today?",
    " leading space",
    "trailing space ",
    "   three leading and trailing   ",
    "tabs\tand\t\ttabs\t",
    "new\nlines\n\n\nand\r\nwindows\r\n",
    "mixed \t\n \n\t  whitespace  \n",
    "\n\n\n",
    "I'm you're he's we've they'll she'd IT'S I'M YOU'RE",
    "don't 'quote' ''double''",
    "Numbers: 0 1 12 123 1234 12345 3.14159 -42 1,000,000 2024-12-02",
    "31415926535897932384626433832795028841971693993751058209749445923078164062862",
    "x1y22z333 v1.2.3 0x1F 1e-9",
    "안녕하세요, 세계! 한국어 토크나이저 테스트입니다.",
    "你好，世界！这是一个中文测试。",
    "こんにちは世界。カタカナとひらがなと漢字。",
    "Emoji: 😀 👍🏽 ❤️ 🇰🇷 👨‍👩‍👧‍👦 🏳️‍🌈 🧑🏿‍💻",
    "Ünïcödé àccénts: naïve café résumé Ångström",
    "decomposed: e\u0301 a\u0308 n\u0303",
    "Arabic: مرحبا بالعالم 123",
    "Hindi: नमस्ते दुनिया",
    "Thai: สวัสดีชาวโลก",
    "Greek & Cyrillic: αβγ δέλτα Привет мир",
    "Math: ∑ x² ≤ ½ ∞ ⅓ Ⅻ ①②③",
    "def f(x):\n    return x ** 2  # comment\n\nprint(f(3))\n",
    "int main() { std::vector<int> v{1, 2, 3}; return v[0] == 1 ? 0 : -1; }",
    "<html><body class=\"x\">&amp; &lt;tag&gt;</body></html>",
    "{\"key\": [1, 2, {\"nested\": null}], \"s\": \"\\n\"}",
    "https://example.com/path?query=1&x=%20#frag",
    "$$$ %%% ^^^ ``` ~~~ ||| \\\\ ...",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text",
    "<|im_start|><|im_start|>nested<|im_end|><|im_end|>",
    "<|im_start <|im_end| <|endoftext <|im_start|",
    "<0xFF> <0x00> \\xff \\u0000",
    "\ufffd replacement \ufffd\ufffd",
    "nul\x00byte and \x01\x02\x1b[31m control \x7f",
    "file separators \x1c\x1d\x1e\x1f here",
    "zero\u200bwidth\u200cjoiner\u200dx \ufeffbom",
    "nbsp\u00a0here\u3000ideographic\u2003em\u2028line\u2029para",
    "a" * 3000,
    "supercalifragilisticexpialidocious " * 20,
    "🙂" * 50,
]



def random_corpus(seed, count=400):
    """Random strings over the characters where pre-tokenizer rules differ."""
    rng = random.Random(seed)
    alphabet = (list("aAzZ019 '   \t\n\r\n.,;!?()[]{}<>|/$+=^`~_-\"#@&*%") +
                ["'s", "'T", "'re", "'LL", "'d", "'ve", "'M", " 123", "4567"] +
                ["\u00a0", "\u3000", "\u2028", "\u000b", "\u000c", "\u0085", "\u001c", "\u200b",
                 "\u0301", "\u093f", "\u0e31", "\u00bd", "\u2163", "\u0663", "\u00b2",
                 "한", "국", "中", "文", "の", "カ", "é", "ß", "Ω", "ж", "ع",
                 "😀", "👍🏽", "\u200d", "\ufe0f", "🇰🇷", "\U0001F9D1",
                 "\x00", "\x7f", "\ufffd"])
    out = []
    for _ in range(count):
        n = rng.randint(1, 24)
        out.append("".join(rng.choice(alphabet) for _ in range(n)))
    return out


RANDOM_CORPUS = random_corpus(1234)

SPM_CORPUS = [
    "",
    "hello world",
    "Hello World",
    " leading and trailing ",
    "  two  spaces  ",
    "the quick brown fox jumps over the lazy dog",
    "numbers 123 4567",
    "tabs\tand\nnewlines\n",
    "안녕하세요 世界 😀",
    "unseen characters: ÆØÅ ß ∑ 👨‍👩‍👧",
    "hellohellohello worldworld",
    "<s> and </s> and <unk> are plain text to sentencepiece",
    "\n\n  \t x",
]


def run_tool(args, payload):
    assert TOOL.exists(), f"{TOOL} is missing; build the tokenize_tool target"
    proc = subprocess.run([str(TOOL), *args], input=json.dumps(payload).encode(),
                          capture_output=True, timeout=300)
    return proc.returncode, json.loads(proc.stdout.decode()), proc.stderr.decode()


def read_gguf_vocab(path):
    reader = gguf.GGUFReader(str(path))

    def arr(key):
        f = reader.fields[key]
        return [f.contents(i) for i in range(len(f.data))]

    return {
        "tokens": arr("tokenizer.ggml.tokens"),
        "types": arr("tokenizer.ggml.token_type"),
        "merges": arr("tokenizer.ggml.merges"),
        "chat_template": reader.fields["tokenizer.chat_template"].contents(),
        "bos": reader.fields["tokenizer.ggml.bos_token_id"].contents(),
        "eos": reader.fields["tokenizer.ggml.eos_token_id"].contents(),
    }


def write_gguf(path, *, model, tokens, types, scores=None, merges=None, pre=None, bos=None,
               eos=None, unk=None, add_bos=None, add_space_prefix=None, chat_template=None):
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    if scores is not None:
        w.add_token_scores(scores)
    if merges is not None:
        w.add_token_merges(merges)
    if bos is not None:
        w.add_bos_token_id(bos)
    if eos is not None:
        w.add_eos_token_id(eos)
    if unk is not None:
        w.add_unk_token_id(unk)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    if add_space_prefix is not None:
        w.add_add_space_prefix(add_space_prefix)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def hf_byte_level(vocab, pre):
    """A Hugging Face tokenizer equivalent to llama.cpp's for pre-tokenizer `pre`."""
    bpe = models.BPE(vocab={t: i for i, t in enumerate(vocab["tokens"])},
                     merges=[tuple(m.split(" ", 1)) for m in vocab["merges"]],
                     ignore_merges=(pre == "llama-bpe"))
    tk = tokenizers.Tokenizer(bpe)
    if pre == "smollm":
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    elif pre == "gpt2":
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    elif pre in ("llama-bpe", "qwen2"):
        regex = LLAMA3_REGEX if pre == "llama-bpe" else QWEN2_REGEX
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(tokenizers.Regex(regex), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    specials = [t for t, ty in zip(vocab["tokens"], vocab["types"]) if ty == 3]
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return tk


def _byte_to_unicode():
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTE_TO_UNICODE = _byte_to_unicode()


def representable(vocab, ch):
    """Whether every UTF-8 byte of `ch` has a single-byte token."""
    if "token_set" not in vocab:
        vocab["token_set"] = set(vocab["tokens"])
    return all(BYTE_TO_UNICODE[b] in vocab["token_set"] for b in ch.encode())


@pytest.fixture(scope="module")
def smol_vocab():
    assert MODEL.exists(), f"{MODEL} is missing; run scripts/setup.sh"
    return read_gguf_vocab(MODEL)


@pytest.mark.parametrize("parse_special", [True, False])
def test_smollm2_matches_hf(smol_vocab, parse_special):
    tk = hf_byte_level(smol_vocab, "smollm")
    tk.encode_special_tokens = not parse_special
    args = [f"--model={MODEL}"] + ([] if parse_special else ["--no-parse-special"])
    corpus = CORPUS + RANDOM_CORPUS
    rc, out, err = run_tool(args, corpus)
    assert rc == 0, err
    for text, got in zip(corpus, out):
        want = tk.encode(text, add_special_tokens=False).ids
        assert got["ids"] == want, f"text={text!r}"
        # Bytes without a token in the vocabulary (SmolLM2 lacks 0x04, 0xFF, ...) are dropped.
        if all(representable(smol_vocab, ch) for ch in text):
            assert got["decoded"] == text, f"decode(encode(x)) != x for {text!r}"
            assert got["streamed"] == text, f"streamed decode != x for {text!r}"
        else:
            assert got["decoded"] == tk.decode(want, skip_special_tokens=False)
        assert got["streamed"] == got["decoded"]


@pytest.mark.parametrize("pre", ["gpt2", "llama-bpe", "qwen2"])
def test_other_pre_tokenizers_match_hf(smol_vocab, pre, tmp_path):
    path = tmp_path / f"{pre}.gguf"
    write_gguf(path, model="gpt2", pre=pre, tokens=smol_vocab["tokens"],
               types=smol_vocab["types"], merges=smol_vocab["merges"], bos=smol_vocab["bos"],
               eos=smol_vocab["eos"], add_bos=False)
    tk = hf_byte_level(smol_vocab, pre)
    corpus = CORPUS + RANDOM_CORPUS
    rc, out, err = run_tool([f"--model={path}"], corpus)
    assert rc == 0, err
    for text, got in zip(corpus, out):
        assert got["ids"] == tk.encode(text, add_special_tokens=False).ids, f"text={text!r}"
        if all(representable(smol_vocab, ch) for ch in text):
            assert got["decoded"] == text


def test_plain_text_input_and_bos(smol_vocab, tmp_path):
    path = tmp_path / "bos.gguf"
    write_gguf(path, model="gpt2", pre="smollm", tokens=smol_vocab["tokens"],
               types=smol_vocab["types"], merges=smol_vocab["merges"], bos=1, eos=2,
               add_bos=True)
    proc = subprocess.run([str(TOOL), f"--model={path}", "--add-special"],
                          input="Hello world".encode(), capture_output=True, check=True)
    tk = hf_byte_level(smol_vocab, "smollm")
    assert json.loads(proc.stdout) == [1] + tk.encode("Hello world").ids


def test_bad_gguf_is_an_error(tmp_path):
    path = tmp_path / "bad.gguf"
    # A merge naming a token that is not in the vocabulary.
    write_gguf(path, model="gpt2", pre="gpt2", tokens=["a", "b"], types=[1, 1], merges=["a c"])
    rc, out, _ = run_tool([f"--model={path}"], ["x"])
    assert rc == 1 and out["error"] == "INVALID_ARGUMENT"
    write_gguf(path, model="bert", tokens=["a"], types=[1])
    rc, out, _ = run_tool([f"--model={path}"], ["x"])
    assert rc == 1 and out["error"] == "UNIMPLEMENTED"


def test_unicode_tables_are_current():
    """unicode_tables.cc is what gen_unicode_tables.py makes (for the same Unicode version)."""
    import unicodedata
    table = SOURCE_DIR / "engine/tokenizer/unicode_tables.cc"
    first_line = table.read_text().splitlines()[0]
    if f"Unicode {unicodedata.unidata_version}." not in first_line:
        pytest.skip(f"this Python has Unicode {unicodedata.unidata_version}: {first_line}")
    generated = subprocess.run(
        [sys.executable,
         str(SOURCE_DIR / "engine/tokenizer/gen_unicode_tables.py")],
        capture_output=True, check=True, text=True).stdout
    assert generated == table.read_text(), "run engine/tokenizer/gen_unicode_tables.py again"


# ---- SentencePiece BPE ------------------------------------------------------------------------

SPM_TRAINING_TEXT = """\
The quick brown fox jumps over the lazy dog. Hello world, hello there.
Tokenizers split text into pieces; byte fallback covers characters never seen in training.
The model merges the most frequent pairs first, and scores order the merges.
In the beginning the world was without form, and the words were few and far between.
Numbers like 123 and 4567 appear here and there, with hello and world again and again.
"""


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("spm")
    corpus = d / "corpus.txt"
    corpus.write_text(SPM_TRAINING_TEXT * 20)
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(d / "m"), model_type="bpe", vocab_size=400,
        byte_fallback=True, normalization_rule_name="identity", add_dummy_prefix=True,
        remove_extra_whitespaces=False, hard_vocab_limit=False, character_coverage=1.0,
        split_digits=False, bos_id=1, eos_id=2, unk_id=0, pad_id=-1, num_threads=1,
        minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(d / "m.model"))
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        types.append(2 if sp.is_unknown(i) else 3 if sp.is_control(i) else
                     6 if sp.is_byte(i) else 5 if sp.is_unused(i) else 1)
    path = d / "spm.gguf"
    write_gguf(path, model="llama", tokens=tokens, types=types, scores=scores, bos=1, eos=2,
               unk=0, add_bos=True, add_space_prefix=True)
    return sp, path


def test_sentencepiece_matches_reference(spm_model):
    sp, path = spm_model
    # sentencepiece treats "<s>" in text as text: compare without special-token parsing.
    rc, out, err = run_tool([f"--model={path}", "--no-parse-special"], SPM_CORPUS)
    assert rc == 0, err
    for text, got in zip(SPM_CORPUS, out):
        want = sp.encode(text)
        assert got["ids"] == want, f"text={text!r}: {[sp.id_to_piece(i) for i in want]}"
        assert got["decoded"] == text
        assert got["streamed"] == text
        assert sp.decode(got["ids"]) == text
    rc, out, err = run_tool([f"--model={path}", "--add-special"], SPM_CORPUS[1:3])
    assert rc == 0, err
    for text, got in zip(SPM_CORPUS[1:3], out):
        assert got["ids"] == [1] + sp.encode(text)


# ---- Chat templates ---------------------------------------------------------------------------

LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ "
    "message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}")

CONVERSATIONS = [
    [],
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "  padded \n"}, {"role": "assistant", "content": "\tok\n"},
     {"role": "user", "content": "안녕 😀 <|im_end|>"}],
    [{"role": "user", "content": ""}, {"role": "assistant", "content": "x"},
     {"role": "system", "content": "late system"}],
    [{"role": "tool", "content": "{\"result\": 4}"}],
]


def jinja_render(template, messages, add_generation_prompt, bos_token):
    # As transformers' apply_chat_template does it.
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=messages,
                                             add_generation_prompt=add_generation_prompt,
                                             bos_token=bos_token, eos_token="")


@pytest.mark.parametrize("family", ["smollm2", "llama3"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_jinja(smol_vocab, family, add_generation_prompt):
    template = smol_vocab["chat_template"] if family == "smollm2" else LLAMA3_TEMPLATE
    bos = "<|begin_of_text|>" if family == "llama3" else ""
    for messages in CONVERSATIONS:
        request = {"messages": messages, "add_generation_prompt": add_generation_prompt,
                   "bos_token": bos}
        if family == "llama3":
            request["template"] = template
            args = []
        else:
            args = [f"--model={MODEL}"]  # the template comes from the GGUF
        rc, out, err = run_tool(args + ["--chat"], request)
        assert rc == 0, err
        assert out["text"] == jinja_render(template, messages, add_generation_prompt, bos), \
            f"messages={messages}"


def test_chat_template_errors():
    rc, out, _ = run_tool(["--chat"], {"messages": [{"role": "wizard", "content": "x"}],
                                       "template": LLAMA3_TEMPLATE})
    assert rc == 1 and out["error"] == "INVALID_ARGUMENT" and "wizard" in out["message"]
    # A template that raises for this conversation: the request is refused with its message.
    alternate = ("{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
                 "{{ raise_exception('roles must alternate') }}{% endif %}{% endfor %}")
    rc, out, _ = run_tool(["--chat"], {"messages": [{"role": "user", "content": "a"}] * 2,
                                       "template": alternate})
    assert rc == 1 and out["error"] == "INVALID_ARGUMENT" and "roles must alternate" in out["message"]
    # jinja2 raises too, as transformers defines raise_exception.
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    with pytest.raises(jinja2.TemplateError, match="roles must alternate"):
        env.from_string(alternate).render(messages=[{"role": "user", "content": "a"}] * 2)
    # A template that does not parse and is no built-in family: refused, naming the parse error.
    rc, out, _ = run_tool(["--chat"], {"messages": [], "template": "{% if messages %}"})
    assert rc == 1 and out["error"] == "INVALID_ARGUMENT" and "line 1" in out["message"]


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_default_model_template_runs_as_jinja_and_matches_builtin_chatml(add_generation_prompt):
    # The default model (SmolLM2) ships its template; it is rendered by the Jinja engine, and the
    # built-in ChatML renderer it used before gives the same bytes (both equal jinja2's, above).
    for messages in CONVERSATIONS:
        request = {"messages": messages, "add_generation_prompt": add_generation_prompt}
        rc, jinja_out, err = run_tool([f"--model={MODEL}", "--chat"], request)
        assert rc == 0, err
        assert jinja_out["kind"] == "jinja"
        rc, builtin_out, err = run_tool([f"--model={MODEL}", "--chat"], {**request, "builtin": True})
        assert rc == 0, err
        assert builtin_out["kind"] == "chatml"
        assert jinja_out["text"] == builtin_out["text"], f"messages={messages}"
