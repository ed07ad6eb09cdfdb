"""Block hashes from Tandem (block_hash_tool) against the definition in docs/block_hashing.md,
computed here with the reference xxHash bindings (PyPI `xxhash`). The router, tools in other
languages and the KV events all depend on these values matching exactly."""
import os
import random
import struct
import subprocess
from pathlib import Path

import xxhash

BIN = Path(os.environ["TANDEM_BIN_DIR"])
SEED = int.from_bytes(b"TANDEMH1", "little")


def model_hash(model_id: str) -> int:
    return xxhash.xxh3_64_intdigest(model_id.encode("utf-8"), seed=SEED)


def block_hashes(model_id: str, tokens: list[int], block_size: int) -> list[int]:
    """docs/block_hashing.md, written from the document alone."""
    model = model_hash(model_id)
    hashes: list[int] = []
    parent = 0
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = tokens[start:start + block_size]
        data = struct.pack("<QQ", parent, model) + struct.pack(f"<{len(block)}I", *block)
        parent = xxhash.xxh3_64_intdigest(data, seed=SEED)
        hashes.append(parent)
    return hashes


def tandem_hashes(model_id: str, tokens: list[int], block_size: int) -> tuple[int, list[int]]:
    out = subprocess.run([str(BIN / "block_hash_tool"), model_id, str(block_size)] +
                         [str(t) for t in tokens], check=True, capture_output=True, text=True)
    lines = out.stdout.split()
    assert lines[0] == "model"
    return int(lines[1], 16), [int(x, 16) for x in lines[2:]]


def test_seed_spells_tandemh1():
    assert SEED == 0x3148_4D45_444E_4154


def test_hashes_match_the_document():
    rng = random.Random(7)
    cases = [("SmolLM2-135M-Instruct", 16, 200), ("m", 1, 5), ("Llama-3.1-8B", 16, 15),
             ("ünïcode-model", 32, 100), ("", 4, 37)]
    for model_id, block_size, n in cases:
        tokens = [rng.randrange(0, 2**31 - 1) if i % 7 == 0 else rng.randrange(0, 50000)
                  for i in range(n)]
        got_model, got = tandem_hashes(model_id, tokens, block_size)
        assert got_model == model_hash(model_id), model_id
        assert got == block_hashes(model_id, tokens, block_size), (model_id, block_size)
        assert len(got) == n // block_size  # a partial last block has no hash


def test_chain_and_model_id_are_inputs():
    tokens = list(range(64))
    _, base = tandem_hashes("a", tokens, 16)
    _, other_model = tandem_hashes("b", tokens, 16)
    assert not set(base) & set(other_model)
    changed = tokens.copy()
    changed[20] += 1  # block 1
    _, after = tandem_hashes("a", changed, 16)
    assert after[0] == base[0]
    assert all(a != b for a, b in zip(after[1:], base[1:]))
