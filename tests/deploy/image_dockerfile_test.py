"""The images' Dockerfiles (deploy/docker/Dockerfile.cpu, Dockerfile.gpu) keep to the image
contract and agree with the runtime package lists: the runtime stage installs exactly the lists'
packages (read from the list files, not copied out of them), copies in nothing but the four
binaries and the entrypoint, runs as uid 10001 with the contract's entrypoint, and no model gets
into an image. The build stage builds what the contract names with the project's build
dependencies (scripts/setup.sh). Parsed with image_files' line parser; no image is built here."""
import re

import pytest

from image_files import (BINARIES, DOCKER_DIR, DOCKERFILES, IMAGE_BIN, IMAGE_ENTRYPOINT,
                         PACKAGE_LISTS, ROOT, parse_dockerfile, read_package_list, shell_commands)

VARIANTS = ["cpu", "gpu"]
LIST_SUBSTITUTION = re.compile(r"\$\(sed -e 's/#\.\*//' ([^)]*)\)")
# scripts/setup.sh's packages that only tests and development use: not needed to build the
# binaries (git and curl are tools of setup.sh itself; ca-certificates serves them).
SETUP_ONLY = {"git", "curl", "ca-certificates", "iproute2", "python3", "python3-venv", "ucx-utils",
              "libgtest-dev", "libgmock-dev", "libbenchmark-dev", "prometheus",
              "kubernetes-client", "python3-torch", "clang", "libclang-rt-14-dev",
              "openssl",  # the openssl command: test certificates and s_client
              "libmimalloc-dev"}  # tandem_sim's allocator; the image builds no simulator
CUDA_BUILD_PACKAGES = {"cuda-nvcc", "cuda-cudart-dev", "cuda-cccl", "libcublas-dev"}
# What must never be in a runtime image.
BUILD_TOOLS = re.compile(r"(.*-dev|gcc(-\d+)?|g\+\+(-\d+)?|cpp(-\d+)?|clang.*|build-essential|"
                         r"cmake|ninja-build|make|binutils|ccache|cuda-nvcc.*|protobuf-compiler.*)")


@pytest.fixture(scope="module", params=VARIANTS)
def variant(request):
    return request.param


@pytest.fixture(scope="module")
def dockerfile(variant):
    return parse_dockerfile(DOCKERFILES[variant])


def apt_installs(run):
    """[(explicit packages, [list files read by $(sed ...)])] of a RUN's `apt-get install`s."""
    installs = []
    for command in shell_commands(run.command):
        if "apt-get install" not in command:
            continue
        files = [f for m in LIST_SUBSTITUTION.finditer(command) for f in m.group(1).split()]
        words = LIST_SUBSTITUTION.sub("", command).split("apt-get install", 1)[1].split()
        installs.append(([w for w in words if not w.startswith("-")], files,
                         "--no-install-recommends" in words))
    return installs


def apt_purges(run):
    return {w for c in shell_commands(run.command) if "apt-get purge" in c
            for w in c.split("apt-get purge", 1)[1].split() if not w.startswith("-")}


def setup_packages():
    text = (ROOT / "scripts" / "setup.sh").read_text()
    block = re.search(r"^APT_PACKAGES=\(\n(.*?)^\)", text, re.S | re.M).group(1)
    return {w for line in block.splitlines() for w in line.split("#")[0].split()}


def test_stages_and_pinned_debian_bases(variant, dockerfile):
    names = [s.name for s in dockerfile.stages]
    expected = ["build", "runtime"] if variant == "cpu" else ["cuda-keyring", "build", "runtime"]
    assert names == expected, names
    build, runtime = dockerfile.stage("build"), dockerfile.final
    build_base, runtime_base = dockerfile.resolve(build.base), dockerfile.resolve(runtime.base)
    # A Debian 12 point release, the same for both stages (digests are added by build arguments).
    release = re.fullmatch(r"debian:(12\.\d+)", build_base)
    assert release, f"the build stage's base {build_base} is not a pinned Debian 12 point release"
    assert runtime_base == f"debian:{release.group(1)}-slim", runtime_base
    if variant == "gpu":
        assert dockerfile.stage("cuda-keyring").base == "scratch"


def test_the_runtime_stage_installs_exactly_the_package_lists(variant, dockerfile):
    runtime = dockerfile.final
    list_installs = []
    for run in runtime.runs():
        mounted = {m["target"]: m for m in run.mounts}
        purged = apt_purges(run)
        for packages, files, no_recommends in apt_installs(run):
            assert no_recommends, f"apt-get install without --no-install-recommends: {run.command}"
            # Packages named in the Dockerfile are only helpers of this step, purged in it.
            assert set(packages) <= purged, \
                f"the runtime stage installs {sorted(set(packages) - purged)} for good"
            for f in files:
                mount = mounted.get(f)
                assert mount and mount.get("type") == "bind" and "from" not in mount, \
                    f"{f} is read but not bind-mounted from the build context: {run.mounts}"
                list_installs.append(mount["source"])
    expected = [str(p.relative_to(ROOT)) for p in PACKAGE_LISTS[variant]]
    assert list_installs == expected, list_installs
    helpers = {p for run in runtime.runs() for packages, _, _ in apt_installs(run) for p in packages}
    listed = {p.name for path in PACKAGE_LISTS[variant] for p in read_package_list(path)}
    assert not helpers & listed, f"purged helpers that the image needs: {helpers & listed}"


def test_the_lists_hold_no_build_tools():
    for path in PACKAGE_LISTS["gpu"]:
        for package in read_package_list(path):
            assert not BUILD_TOOLS.fullmatch(package.name), \
                f"{path.name}:{package.line}: {package.name} is a build tool or headers"


def test_the_runtime_stage_copies_only_the_binaries_and_the_entrypoint(variant, dockerfile):
    runtime = dockerfile.final
    assert not runtime.all("ADD"), "ADD in the runtime stage"
    copies = runtime.copies()
    assert len(copies) == 1, copies
    copy = copies[0]
    assert copy.options.get("from") == "build", copy
    wanted = [f"{IMAGE_BIN}/{b}" for b in BINARIES] + [IMAGE_ENTRYPOINT]
    assert sorted(copy.sources) == sorted(wanted) and copy.dest == f"{IMAGE_BIN}/", copy
    # The RUN steps see nothing else of the build context than the lists (and NVIDIA's key).
    for run in runtime.runs():
        for mount in run.mounts:
            if mount.get("from") == "cuda-keyring":
                assert mount["source"] == "/cuda-keyring.deb", mount
            else:
                assert mount["source"] in [str(p.relative_to(ROOT)) for p in PACKAGE_LISTS[variant]]
    # The build stage puts exactly the contract's files there.
    build = " ".join(r.command for r in dockerfile.stage("build").runs())
    targets = re.search(r"cmake --build --preset release --target ((?:[\w-]+ ?)+)", build)
    assert targets and targets.group(1).split() == BINARIES, build
    loop = re.search(r'for b in ([\w -]+); do install -m 0755 "build/release/bin/\$b" '
                     + re.escape(IMAGE_BIN) + "/", build)
    assert loop and loop.group(1).split() == BINARIES, build
    assert f"install -m 0755 deploy/docker/entrypoint.sh {IMAGE_ENTRYPOINT}" in build


def test_the_build_stage_builds_the_release_preset_without_tests(variant, dockerfile):
    build = dockerfile.stage("build")
    commands = " ".join(r.command for r in build.runs())
    assert "cmake --preset release -DTANDEM_BUILD_TESTS=OFF" in commands
    if variant == "cpu":
        assert "-DTANDEM_CUDA=OFF" in commands
    else:
        assert "-DTANDEM_CUDA=ON" in commands
        assert '"-DCMAKE_CUDA_ARCHITECTURES=80;90"' in commands
        assert '"-DCMAKE_CUDA_COMPILER=/usr/local/cuda-${CUDA_VERSION}/bin/nvcc"' in commands
    # COPY . . brings the sources; .dockerignore keeps models, build trees and the venv out.
    assert [(c.sources, c.dest) for c in build.copies()] == [(["."], ".")]


def test_the_build_stage_has_the_build_dependencies_of_setup_sh(variant, dockerfile):
    installed = set()
    for run in dockerfile.stage("build").runs():
        for packages, files, _ in apt_installs(run):
            assert not files
            installed.update(packages)
    cuda = {p for p in installed if p.startswith('"')}
    debian = installed - cuda
    setup = setup_packages()
    assert debian - {"ca-certificates"} <= setup, \
        f"build packages that scripts/setup.sh does not install: {debian - setup}"
    assert setup - SETUP_ONLY <= debian, \
        f"scripts/setup.sh's build dependencies missing from the build stage: {setup - SETUP_ONLY - debian}"
    if variant == "gpu":
        assert {c.strip('"').replace("-$cuda", "") for c in cuda} == CUDA_BUILD_PACKAGES, cuda
    else:
        assert not cuda


def test_runs_as_uid_10001_with_the_contracts_entrypoint(dockerfile):
    runtime = dockerfile.final
    users = runtime.all("USER")
    assert [u.text for u in users] == ["10001:10001"], users
    assert runtime.instructions.index(users[0]) > max(
        runtime.instructions.index(i) for i in runtime.all("RUN")), "a RUN after USER"
    commands = " ".join(r.command for r in runtime.runs())
    assert "groupadd --gid 10001 tandem" in commands
    assert re.search(r"useradd --uid 10001 --gid 10001 .*--no-create-home .*tandem", commands)
    assert "install -d -o 10001 -g 10001 -m 0750 /var/lib/tandem" in commands
    assert [w.text for w in runtime.all("WORKDIR")] == ["/var/lib/tandem"]
    entrypoints = runtime.all("ENTRYPOINT")
    assert len(entrypoints) == 1 and entrypoints[0].json_args() == [IMAGE_ENTRYPOINT]
    assert not runtime.all("CMD"), "a CMD would become the role; the role is explicit"


def test_no_model_gets_into_an_image(dockerfile):
    for stage in dockerfile.stages:
        assert not stage.all("VOLUME"), "VOLUME would make an anonymous model volume"
        for instruction in stage.instructions:
            assert not re.search(r"gguf|/models|huggingface|hf_hub", instruction.text, re.I), \
                f"{dockerfile.path.name}:{instruction.line}: {instruction.text}"
    ignored = [l.strip() for l in (ROOT / ".dockerignore").read_text().splitlines()
               if l.strip() and not l.startswith("#")]
    for pattern in ["models", "**/*.gguf", "build", ".venv", ".git"]:
        assert pattern in ignored, f".dockerignore does not exclude {pattern}"


def env_of(stage):
    env = {}
    for instruction in stage.all("ENV"):
        for pair in re.findall(r'(\w+)=("[^"]*"|\S+)', instruction.text):
            env[pair[0]] = pair[1].strip('"')
    return env


def test_the_gpu_image_asks_the_nvidia_runtime_for_compute_and_pins_nvidias_repository():
    dockerfile = parse_dockerfile(DOCKERFILES["gpu"])
    env = env_of(dockerfile.final)
    assert "compute" in env["NVIDIA_DRIVER_CAPABILITIES"].split(","), env
    assert env["NVIDIA_REQUIRE_CUDA"] == "cuda>=${CUDA_VERSION}", env
    assert "NVIDIA_VISIBLE_DEVICES" not in env, "a pod that asks for no GPU would see them all"
    assert re.fullmatch(r"\d+\.\d+", dockerfile.global_args["CUDA_VERSION"])
    for stage in (dockerfile.stage("build"), dockerfile.final):
        assert "CUDA_VERSION" in stage.args()
        commands = " ".join(r.command for r in stage.runs())
        assert ("Pin: origin \"developer.download.nvidia.com\"\\nPin-Priority: 100" in commands), \
            "NVIDIA's repository must rank below Debian's"
        assert "dpkg -i /tmp/cuda-keyring.deb" in commands
    runtime = " ".join(r.command for r in dockerfile.final.runs())
    assert {"cuda-keyring", "ca-certificates"} <= apt_purges(dockerfile.final.runs()[0])
    assert "/etc/apt/preferences.d/cuda-repository" in runtime.split("rm -rf", 1)[1]
    cpu_env = env_of(parse_dockerfile(DOCKERFILES["cpu"]).final)
    assert cpu_env["PATH"] == env["PATH"]


def test_the_package_lists_parse_and_reject_bad_lines(tmp_path):
    for path in PACKAGE_LISTS["gpu"]:
        assert read_package_list(path), f"{path} is empty"
    bad = tmp_path / "bad.txt"
    for text in ["libfoo1 libbar2\n", "LibFoo\n", "libfoo1\nlibfoo1\n"]:
        bad.write_text(text)
        with pytest.raises(ValueError):
            read_package_list(bad)


def test_the_entrypoint_is_installed_from_an_executable_posix_script():
    assert (DOCKER_DIR / "entrypoint.sh").stat().st_mode & 0o111
    assert (DOCKER_DIR / "entrypoint.sh").read_text().startswith("#!/bin/sh\n")
