"""Every project #include points down the layers of docs/architecture.md.

  common <- engine <- kvtransfer <- worker <- {prefill_worker, decode_worker}
  common <- engine (tokenizer, kv hashing) <- router/placement <- router/registry <- router/server
  cli on top of everything; bench and tests may use any layer but cli.

A module is a top-level folder, or engine/<part> and router/<part>. Headers that are not the
project's (absl/, grpcpp/, the generated tandem/v1/ ...) are checked only where they name a
project layer: "tandem/v1/..." is the proto layer.
"""

import os
import pathlib
import re

import pytest

ROOT = pathlib.Path(os.environ.get("TANDEM_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))

ENGINE_PARTS = {"core", "model", "tokenizer", "cpu", "cuda", "kv", "sched", "sampling", "grammar",
                "runtime"}
ROUTER_PARTS = {"placement", "registry", "server"}

# What each module may include besides itself. The engine's parts have an order of their own:
# core <- {model, cpu, kv, sampling} <- tokenizer (model) / sched (kv) / grammar (sampling: the
# response_format it compiles) <- runtime, cuda beside cpu.
ENGINE_BELOW = {
    "engine/core": set(),
    "engine/model": {"engine/core"},
    "engine/cpu": {"engine/core"},
    "engine/cuda": {"engine/core", "engine/cpu"},
    "engine/kv": {"engine/core"},
    "engine/sampling": set(),
    "engine/tokenizer": {"engine/core", "engine/model"},
    "engine/sched": {"engine/core", "engine/kv"},
    "engine/grammar": {"engine/sampling"},
}
ENGINE_BELOW["engine/runtime"] = set(ENGINE_BELOW)
ENGINE = set(ENGINE_BELOW) | {"engine/runtime"}

ALLOWED = {"common": set()}
for part, below in ENGINE_BELOW.items():
    ALLOWED[part] = {"common"} | below
ALLOWED["engine/runtime"] = {"common"} | ENGINE_BELOW["engine/runtime"]
ALLOWED["proto"] = {"common", "engine/sampling"}
ALLOWED["kvtransfer"] = {"common", "proto"} | ENGINE
ALLOWED["worker"] = ALLOWED["kvtransfer"] | {"kvtransfer"}
ALLOWED["prefill_worker"] = ALLOWED["worker"] | {"worker"}
ALLOWED["decode_worker"] = ALLOWED["worker"] | {"worker"}
ALLOWED["router/placement"] = {"common", "engine/core", "engine/kv", "engine/tokenizer"}
ALLOWED["router/registry"] = ALLOWED["router/placement"] | {"router/placement", "proto"}
ALLOWED["router/server"] = ALLOWED["router/registry"] | {
    "router/registry", "engine/model", "engine/sampling", "sim"}  # sim: the advisory planner
ALLOWED["sim"] = {"common", "proto", "router/placement", "router/registry"} | ENGINE
EVERYTHING = set(ALLOWED) | {"prefill_worker", "decode_worker", "router/server", "worker"}
ALLOWED["bench"] = EVERYTHING
ALLOWED["tests"] = EVERYTHING
ALLOWED["cli"] = EVERYTHING

SOURCE_SUFFIXES = {".h", ".cc", ".cu", ".cuh", ".inc"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def module_of(path: str):
    """The layer a repository path (or an include path) belongs to; None outside the project."""
    parts = path.split("/")
    if parts[0] == "tandem" and len(parts) > 1 and parts[1] == "v1":
        return "proto"
    if parts[0] == "engine" and len(parts) > 2 and parts[1] in ENGINE_PARTS:
        return f"engine/{parts[1]}"
    if parts[0] == "router" and len(parts) > 2 and parts[1] in ROUTER_PARTS:
        return f"router/{parts[1]}"
    if parts[0] in {"common", "proto", "kvtransfer", "worker", "prefill_worker", "decode_worker",
                    "cli", "bench", "tests", "sim"} and len(parts) > 1:
        return parts[0]
    return None


def violations(files):
    """(file, include, reason) for every include in `files` ({path: text}) against the layers."""
    found = []
    for path, text in sorted(files.items()):
        mod = module_of(path)
        if mod is None:
            continue
        for inc in INCLUDE.findall(text):
            target = module_of(inc)
            if target is None or target == mod:
                continue
            if mod not in ALLOWED:
                found.append((path, inc, f"{mod} is not a known layer"))
            elif target not in ALLOWED[mod]:
                found.append((path, inc, f"{mod} may not include {target}"))
    return found


def project_sources():
    files = {}
    for top in ("common", "proto", "engine", "kvtransfer", "worker", "prefill_worker",
                "decode_worker", "router", "cli", "bench", "sim", "tests"):
        base = ROOT / top
        if not base.is_dir():
            continue
        for p in base.rglob("*"):
            if p.suffix in SOURCE_SUFFIXES and p.is_file():
                files[p.relative_to(ROOT).as_posix()] = p.read_text(errors="replace")
    return files


def test_every_include_points_down_the_layers():
    files = project_sources()
    assert len(files) > 100, f"found only {len(files)} sources under {ROOT}"
    bad = violations(files)
    assert not bad, "includes against the layers:\n" + "\n".join(
        f"  {path}: #include \"{inc}\" ({why})" for path, inc, why in bad)


@pytest.mark.parametrize("path,include", [
    ("engine/runtime/local_engine.cc", "worker/engine_loop.h"),
    ("engine/kv/block_pool.h", "kvtransfer/kv_transport.h"),
    ("kvtransfer/ucx_transport.cc", "worker/engine_loop.h"),
    ("worker/worker_process.cc", "cli/up.h"),
    ("router/server/main.cc", "worker/worker_process.h"),
    ("router/placement/placement.h", "router/registry/worker_view.h"),
    ("router/placement/placement.h", "tandem/v1/worker.pb.h"),
    ("router/registry/worker_view.h", "router/server/registry.h"),
    ("common/logging.h", "engine/core/dtype.h"),
    ("engine/core/dtype.h", "engine/runtime/step.h"),
    ("engine/tokenizer/tokenizer.h", "engine/runtime/step.h"),
    ("proto/conversion.h", "engine/runtime/local_engine.h"),
    ("bench/engine_bench.cc", "cli/up.h"),
])
def test_an_include_against_the_layers_is_found(path, include):
    assert violations({path: f'#include "{include}"\n'}), f"{path} -> {include} passed"


@pytest.mark.parametrize("path,include", [
    ("worker/engine_loop.h", "engine/runtime/local_engine.h"),
    ("prefill_worker/prefill_service.h", "kvtransfer/kv_transport.h"),
    ("router/server/request_router.cc", "proto/conversion.h"),
    ("router/placement/placement.h", "engine/kv/block_hash.h"),
    ("cli/main.cc", "router/server/registry.h"),
    ("engine/runtime/local_engine.h", "engine/cpu/matmul.h"),
])
def test_an_include_down_the_layers_passes(path, include):
    assert not violations({path: f'#include "{include}"\n'})
