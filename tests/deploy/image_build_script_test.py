"""deploy/docker/build.sh without a real container engine: there is no daemon and no registry
here, so the engines are stand-ins (small scripts on PATH that record how they are called and
answer like docker or podman would). The script must say clearly when no engine can build (none
installed, or the daemon unreachable: exit 3), refuse bad arguments (exit 2), and otherwise run
the builds and pushes with the right Dockerfile, image name, platform and build arguments."""
import os
import pathlib
import shutil
import subprocess

import pytest

from image_files import DOCKERFILES, ROOT

SCRIPT = ROOT / "deploy" / "docker" / "build.sh"
# What build.sh runs besides its engine (its #! line finds bash on PATH).
TOOLS = ["bash", "dirname", "sed", "awk", "head", "git"]
NO_DAEMON = ("Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
             "Is the docker daemon running?")


def fake_engine(bin_dir, name, log, info_ok=True, build_status=0):
    """A stand-in for `name` (docker or podman) that appends its arguments to `log`, one per
    line and a blank line after each call."""
    info = "exit 0" if info_ok else f"echo '{NO_DAEMON}' >&2; exit 1"
    script = bin_dir / name
    script.write_text(f"""#!/bin/sh
for a in "$@"; do printf '%s\\n' "$a" >> '{log}'; done
printf '\\n' >> '{log}'
case "$1 $2" in
  "info "*) {info} ;;
  "buildx version") exit 0 ;;
  "buildx imagetools") printf 'Name:      %s\\nMediaType: application/vnd.oci.image.index.v1+json\\nDigest:    sha256:%s\\n' "$4" 0123abcd ;;
  "buildx build" | "build "*) exit {build_status} ;;
  "pull "*) exit 0 ;;
  "image inspect") echo sha256:4567cdef ;;
  "push "*) exit 0 ;;
esac
""")
    script.chmod(0o755)


@pytest.fixture()
def bin_dir(tmp_path):
    """A PATH folder with the tools build.sh needs and no container engine."""
    path = tmp_path / "bin"
    path.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found, f"{tool} is not installed"
        (path / tool).symlink_to(found)
    return path


def build(bin_dir, *args):
    env = {"PATH": str(bin_dir), "HOME": str(bin_dir.parent)}
    return subprocess.run(["/usr/bin/env", "bash", str(SCRIPT), *args], capture_output=True,
                          text=True, env=env, timeout=60, check=False)


def calls(log):
    """The recorded calls: [[arg, ...], ...]."""
    if not log.exists():
        return []
    return [c.split("\n") for c in log.read_text().split("\n\n") if c]


def project_version():
    for line in (ROOT / "CMakeLists.txt").read_text().splitlines():
        if line.startswith("project(tandem VERSION "):
            return line.split()[2]
    raise AssertionError("no project version in CMakeLists.txt")


def test_without_docker_or_podman_it_says_so_and_exits_3(bin_dir):
    result = build(bin_dir, "--cpu")
    assert result.returncode == 3, result
    assert "[build] FAILED: no container engine can build the images here" in result.stderr
    assert "docker is not installed" in result.stderr and "podman is not installed" in result.stderr
    assert "install Docker (with the buildx plugin) or Podman" in result.stderr


def test_a_docker_without_its_daemon_is_named_with_docker_s_own_words(bin_dir, tmp_path):
    log = tmp_path / "calls"
    fake_engine(bin_dir, "docker", log, info_ok=False)
    result = build(bin_dir)
    assert result.returncode == 3, result
    assert f"docker is installed but cannot reach its daemon or storage: {NO_DAEMON}" \
        in result.stderr
    assert [c[0] for c in calls(log)] == ["info"]  # nothing was built


def test_it_builds_both_images_and_pushes_them(bin_dir, tmp_path):
    log = tmp_path / "calls"
    fake_engine(bin_dir, "docker", log)
    result = build(bin_dir, "--registry", "registry.example.com/ml/", "--tag", "1.2", "--push",
                   "--build-arg", "CUDA_VERSION=13.0")
    assert result.returncode == 0, result
    made = calls(log)
    builds = [c for c in made if c[:2] == ["buildx", "build"]]
    pushes = [c for c in made if c[0] == "push"]
    assert len(builds) == 2, made
    for variant, call in zip(["cpu", "gpu"], builds):
        image = f"registry.example.com/ml/tandem:1.2-{variant}"
        assert call[-1] == str(ROOT), call  # the build context: the repository
        assert call[call.index("-f") + 1] == str(DOCKERFILES[variant])
        assert call[call.index("-t") + 1] == image
        assert "--load" in call and "CUDA_VERSION=13.0" in call
        assert ("--platform" in call) == (variant == "gpu"), call
        assert "org.opencontainers.image.version=1.2" in call
    assert pushes == [["push", "registry.example.com/ml/tandem:1.2-cpu"],
                      ["push", "registry.example.com/ml/tandem:1.2-gpu"]]


def test_the_default_tag_is_the_project_version_and_nothing_is_pushed(bin_dir, tmp_path):
    log = tmp_path / "calls"
    fake_engine(bin_dir, "docker", log)
    result = build(bin_dir, "--cpu")
    assert result.returncode == 0, result
    builds = [c for c in calls(log) if c[:2] == ["buildx", "build"]]
    assert len(builds) == 1 and f"tandem:{project_version()}-cpu" in builds[0]
    assert not [c for c in calls(log) if c[0] == "push"]


def test_podman_builds_when_docker_cannot(bin_dir, tmp_path):
    log = tmp_path / "calls"
    fake_engine(bin_dir, "docker", tmp_path / "docker-calls", info_ok=False)
    fake_engine(bin_dir, "podman", log)
    result = build(bin_dir, "--gpu", "--tag", "t")
    assert result.returncode == 0, result
    assert "[build] engine: podman" in result.stdout
    builds = [c for c in calls(log) if c[0] == "build"]
    assert len(builds) == 1 and builds[0][builds[0].index("-t") + 1] == "tandem:t-gpu"


def test_pinning_digests_builds_from_the_resolved_bases(bin_dir, tmp_path):
    log = tmp_path / "calls"
    fake_engine(bin_dir, "docker", log)
    result = build(bin_dir, "--cpu", "--pin-digests")
    assert result.returncode == 0, result
    build_call = next(c for c in calls(log) if c[:2] == ["buildx", "build"])
    args = {build_call[i + 1] for i, a in enumerate(build_call) if a == "--build-arg"}
    assert args == {"DEBIAN_IMAGE=debian:12.12@sha256:0123abcd",
                    "DEBIAN_SLIM_IMAGE=debian:12.12-slim@sha256:0123abcd"}, build_call


def test_a_failed_build_exits_1(bin_dir, tmp_path):
    fake_engine(bin_dir, "docker", tmp_path / "calls", build_status=1)
    result = build(bin_dir, "--cpu")
    assert result.returncode == 1, result
    assert "the build failed" in result.stdout


@pytest.mark.parametrize("args, message", [
    (["--push"], "--push needs --registry"),
    (["--engine", "rkt"], "--engine must be docker or podman, not 'rkt'"),
    (["--build-arg", "oops"], "--build-arg takes NAME=VALUE, not 'oops'"),
    (["--frobnicate"], "unknown argument: --frobnicate"),
    (["--tag"], "--tag needs a value"),
])
def test_bad_arguments_exit_2_before_any_engine_runs(bin_dir, tmp_path, args, message):
    log = tmp_path / "calls"
    fake_engine(bin_dir, "docker", log)
    result = build(bin_dir, *args)
    assert result.returncode == 2, result
    assert f"[build] FAILED: {message}" in result.stderr
    assert not calls(log)


def test_the_script_is_executable_and_its_help_is_its_header():
    assert os.access(SCRIPT, os.X_OK)
    result = subprocess.run([str(SCRIPT), "--help"], capture_output=True, text=True, timeout=30,
                            check=False)
    assert result.returncode == 0
    assert result.stdout.startswith("Builds Tandem's container images")
    assert "--pin-digests" in result.stdout and "Exit status" in result.stdout
