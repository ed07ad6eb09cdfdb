"""Reference test: Tandem's GGUF reader (through the gguf_dump tool) against gguf-py's GGUFReader.

gguf-py (the reader/writer maintained with llama.cpp) is an independent implementation. For the
default model and for files written by gguf-py's GGUFWriter with random tensors, every metadata
key/type/value, every tensor's name/type/shape/offset/size and every dequantized value must match.

Dequantized values are compared EXACTLY (bit patterns): gguf-py computes Q8_0 as d * q, Q4_0 as
d * (q - 8) and Q4_1 as d * q + m in float32 with separate multiply and add, and F16/BF16 widening
is exact, which is what engine/core's DequantizeReference does (no FMA contraction in the
project's C++20 build). For large tensors the comparison uses two exact checksums of the float32
bit patterns (sum and index-weighted sum mod 2^64) plus the first/last 8 values; small files are
compared value by value.
"""

import json
import os
import pathlib
import subprocess

import numpy as np
import pytest

import gguf
from gguf import GGMLQuantizationType as Q

BIN_DIR = pathlib.Path(os.environ.get("TANDEM_BIN_DIR", "build/release/bin"))
SOURCE_DIR = pathlib.Path(os.environ.get("TANDEM_SOURCE_DIR", "."))
DUMP = BIN_DIR / "gguf_dump"
DEFAULT_MODEL = SOURCE_DIR / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"

TYPE_NAMES = {Q.F32: "F32", Q.F16: "F16", Q.BF16: "BF16", Q.Q8_0: "Q8_0", Q.Q4_0: "Q4_0",
              Q.Q4_1: "Q4_1", Q.Q5_0: "Q5_0", Q.Q5_1: "Q5_1", Q.IQ4_NL: "IQ4_NL", Q.Q4_K: "Q4_K",
              Q.Q5_K: "Q5_K", Q.Q6_K: "Q6_K", Q.Q8_K: "Q8_K"}


def dequantize(data, qtype):
    """gguf-py's dequantization; for Q8_K, which gguf-py does not dequantize, the format's
    definition (f32 d, then 256 int8 codes, then 16 int16 sums: x = d * q) in numpy."""
    if qtype != Q.Q8_K:
        return gguf.quants.dequantize(data, qtype)
    _, type_size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = np.ascontiguousarray(data).view(np.uint8).reshape(-1, type_size)
    d = blocks[:, :4].copy().view(np.float32)
    q = blocks[:, 4:260].view(np.int8).astype(np.float32)
    return d * q


def run_dump(path, values=False):
    assert DUMP.exists(), f"{DUMP} is missing: build the gguf_dump target first"
    args = [str(DUMP)] + (["--values"] if values else []) + [str(path)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def field_type(field):
    """The dump's type description for a gguf-py ReaderField."""
    def describe(types):
        if types[0] != gguf.GGUFValueType.ARRAY:
            return types[0].name.lower()
        return {"array": types[1].name.lower() if len(types) > 1 else "uint8"}
    return describe(field.types)


def checksums(values):
    bits = np.ascontiguousarray(values, dtype=np.float32).reshape(-1).view(np.uint32)
    bits = bits.astype(np.uint64)
    idx = np.arange(1, bits.size + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return str(int(bits.sum(dtype=np.uint64))), str(int((bits * idx).sum(dtype=np.uint64)))


def compare(path, values=False):
    """Compares gguf_dump's view of `path` with GGUFReader's; returns (dump, reader)."""
    dump = run_dump(path, values=values)
    reader = gguf.GGUFReader(str(path))

    fields = [f for name, f in reader.fields.items() if not name.startswith("GGUF.")]
    assert [m["key"] for m in dump["metadata"]] == [f.name for f in fields]
    for m, f in zip(dump["metadata"], fields):
        assert m["type"] == field_type(f), m["key"]
        expected = f.contents()
        if isinstance(expected, float):
            # float32 metadata: the dump prints the exact float32 value widened to double.
            assert m["value"] == expected, m["key"]
        else:
            assert m["value"] == expected, m["key"]

    alignment = reader.alignment
    assert dump["alignment"] == alignment
    assert len(dump["tensors"]) == len(reader.tensors)
    for t, rt in zip(dump["tensors"], reader.tensors):
        assert t["name"] == rt.name
        assert t["type"] == TYPE_NAMES[rt.tensor_type], rt.name
        assert t["shape"] == [int(x) for x in rt.shape], rt.name
        assert t["offset"] == rt.data_offset, rt.name
        assert t["offset"] % alignment == 0
        assert t["bytes"] == rt.n_bytes, rt.name
        ref = dequantize(rt.data, rt.tensor_type).astype(np.float32).reshape(-1)
        assert ref.size == int(np.prod(t["shape"]))
        s, ws = checksums(ref)
        assert (t["bits_sum"], t["bits_wsum"]) == (s, ws), rt.name
        k = min(8, ref.size)
        assert t["first"] == ref[:k].tolist(), rt.name
        assert t["last"] == ref[ref.size - k:].tolist(), rt.name
        if values:
            np.testing.assert_array_equal(np.array(t["values"], dtype=np.float32), ref,
                                          err_msg=rt.name)
    return dump, reader


def test_default_model_matches_gguf_py():
    assert DEFAULT_MODEL.exists(), f"default model missing at {DEFAULT_MODEL}"
    compare(DEFAULT_MODEL)


def test_default_model_config_matches_metadata():
    dump = run_dump(DEFAULT_MODEL)
    reader = gguf.GGUFReader(str(DEFAULT_MODEL))

    def meta(key):
        return reader.fields[key].contents()

    arch = meta("general.architecture")
    cfg = dump["config"]
    assert dump["load_status"] == "OK"
    assert cfg["architecture"] == arch == "llama"
    assert cfg["num_layers"] == meta(f"{arch}.block_count")
    assert cfg["hidden_size"] == meta(f"{arch}.embedding_length")
    assert cfg["intermediate_size"] == meta(f"{arch}.feed_forward_length")
    assert cfg["num_heads"] == meta(f"{arch}.attention.head_count")
    assert cfg["num_kv_heads"] == meta(f"{arch}.attention.head_count_kv")
    assert cfg["head_dim"] == cfg["hidden_size"] // cfg["num_heads"]
    assert cfg["head_dim"] == meta(f"{arch}.rope.dimension_count")
    assert cfg["max_context"] == meta(f"{arch}.context_length")
    assert cfg["rms_norm_eps"] == meta(f"{arch}.attention.layer_norm_rms_epsilon")
    assert cfg["rope_theta"] == meta(f"{arch}.rope.freq_base")
    assert cfg["vocab_size"] == len(reader.fields["tokenizer.ggml.tokens"].data)
    names = {t.name for t in reader.tensors}
    assert cfg["tie_word_embeddings"] == ("output.weight" not in names)
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    assert [int(x) for x in embd.shape] == [cfg["hidden_size"], cfg["vocab_size"]]
    # The published numbers for SmolLM2-135M, now checked against gguf-py above.
    assert (cfg["num_layers"], cfg["hidden_size"], cfg["num_heads"], cfg["num_kv_heads"],
            cfg["intermediate_size"], cfg["vocab_size"], cfg["tie_word_embeddings"]) == (
                30, 576, 9, 3, 1536, 49152, True)


QUANT_TYPES = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1]
SHAPES = [(32,), (3, 64), (2, 2, 96), (2, 1, 3, 32), (5, 128)]  # numpy order; ne[0] is last


def write_random_file(path, seed, alignment=None):
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch="llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_uint8("t.u8", 255)
    w.add_int8("t.i8", -128)
    w.add_uint16("t.u16", 65535)
    w.add_int16("t.i16", -32768)
    w.add_uint32("t.u32", 4294967295)
    w.add_int32("t.i32", -2147483648)
    w.add_uint64("t.u64", 2**64 - 1)
    w.add_int64("t.i64", -2**63)
    w.add_float32("t.f32", float(np.float32(rng.standard_normal())))
    w.add_float64("t.f64", float(rng.standard_normal()))
    w.add_bool("t.bool", True)
    w.add_string("t.str", "h\u00e9llo \u20ac \U0001F600")
    w.add_string("t.empty", "")
    w.add_array("t.strs", ["a", "", "\u00fc"])
    w.add_array("t.ints", [int(x) for x in rng.integers(-1000, 1000, 5)])
    w.add_array("t.floats", [float(np.float32(x)) for x in rng.standard_normal(4)])
    w.add_array("t.bools", [True, False, True])
    w.add_array("t.empty_arr", [])
    expected = {}
    i = 0
    for qt in QUANT_TYPES:
        for shape in SHAPES:
            data = (rng.standard_normal(shape) * 2).astype(np.float32)
            name = f"blk.{i}.{TYPE_NAMES[qt]}"
            if qt == Q.F32:
                w.add_tensor(name, data)
            elif qt == Q.F16:
                w.add_tensor(name, data.astype(np.float16))
            else:
                w.add_tensor(name, gguf.quants.quantize(data, qt), raw_dtype=qt)
            expected[name] = (qt, list(reversed(shape)))
            i += 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


@pytest.mark.parametrize("seed,alignment", [(1, None), (2, 64), (3, 256)])
def test_gguf_py_written_files_match(tmp_path, seed, alignment):
    path = tmp_path / f"random_{seed}.gguf"
    expected = write_random_file(path, seed, alignment)
    dump, _ = compare(path, values=True)
    assert dump["version"] == 3
    assert dump["alignment"] == (alignment or 32)
    got = {t["name"]: (t["type"], t["shape"]) for t in dump["tensors"]}
    assert got == {k: (TYPE_NAMES[qt], shape) for k, (qt, shape) in expected.items()}
    # Not a loadable model (no llama.* keys): the loader must say which key is missing.
    assert "config" not in dump
    assert "llama.block_count" in dump["config_error"]


# Byte offsets of each block's float scales: (offset, "f16" | "f32"). Every other byte is random.
BLOCK_SCALES = {
    Q.Q5_0: [(0, "f16")], Q.Q5_1: [(0, "f16"), (2, "f16")], Q.IQ4_NL: [(0, "f16")],
    Q.Q4_K: [(0, "f16"), (2, "f16")], Q.Q5_K: [(0, "f16"), (2, "f16")], Q.Q6_K: [(208, "f16")],
    Q.Q8_K: [(0, "f32")],
}


def random_blocks(rng, qtype, rows, blocks_per_row):
    """`rows` rows of random blocks of `qtype` (random codes, scales and mins; finite, signed
    scales), as the uint8 array GGUFWriter takes for a raw tensor."""
    _, type_size = gguf.GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, size=(rows * blocks_per_row, type_size), dtype=np.uint8)
    for offset, kind in BLOCK_SCALES[qtype]:
        dtype = np.float16 if kind == "f16" else np.float32
        scales = (rng.standard_normal(rows * blocks_per_row) * 0.05).astype(dtype)
        data[:, offset:offset + scales.itemsize * 1] = scales.view(np.uint8).reshape(-1, scales.itemsize)
    return data.reshape(rows, blocks_per_row * type_size)


@pytest.mark.parametrize("qtype", list(BLOCK_SCALES), ids=lambda q: TYPE_NAMES[q])
def test_new_block_types_dequantize_like_gguf_py(tmp_path, qtype):
    """Q5_0/Q5_1/IQ4_NL and the K-quants: random blocks (every code, scale and min pattern the
    format can hold) dequantize bit for bit as gguf-py does (Q8_K: as the format defines)."""
    rng = np.random.default_rng(int(qtype))
    block_size, _ = gguf.GGML_QUANT_SIZES[qtype]
    path = tmp_path / f"{TYPE_NAMES[qtype]}.gguf"
    w = gguf.GGUFWriter(str(path), arch="llama")
    shapes = {}
    for i, (rows, blocks_per_row) in enumerate([(1, 1), (3, 2), (7, 5), (64, 9)]):
        name = f"blk.{i}.{TYPE_NAMES[qtype]}"
        w.add_tensor(name, random_blocks(rng, qtype, rows, blocks_per_row), raw_dtype=qtype)
        shapes[name] = [blocks_per_row * block_size, rows] if rows > 1 else [block_size]
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    dump, _ = compare(path, values=True)
    assert {t["name"]: t["type"] for t in dump["tensors"]} == {
        name: TYPE_NAMES[qtype] for name in shapes}


def test_truncated_file_is_an_error_not_a_crash(tmp_path):
    path = tmp_path / "full.gguf"
    write_random_file(path, 7)
    data = path.read_bytes()
    # GGUFWriter pads after the last tensor; cutting only padding leaves a valid file.
    last = max(t.data_offset + t.n_bytes for t in gguf.GGUFReader(str(path)).tensors)
    for cut in [0, 3, 10, 24, 100, last // 2, last - 1]:
        bad = tmp_path / f"cut_{cut}.gguf"
        bad.write_bytes(data[:cut])
        proc = subprocess.run([str(DUMP), str(bad)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 1, (cut, proc.stderr)
        assert "DATA_LOSS" in proc.stderr and str(bad) in proc.stderr, proc.stderr
