"""The images' runtime package lists against the build: every shared library that `ldd` resolves
for the binaries that go into the images (tandem, tandem-router, tandem-prefill, tandem-decode in
TANDEM_BIN_DIR) and for UCX's transport modules (which libucs loads at run time) belongs to a
package that the runtime stage installs (deploy/docker/runtime-packages.txt) or that
debian:12-slim already has; no library is "not found"; and every listed package is needed by one
of them, or says why it is needed at run time.

A library's package is what `dpkg -S` says owns its file (tried under both names of Debian 12's
merged /usr). CUDA libraries are not from Debian: in a build configured with CUDA they are mapped
by soname to NVIDIA's package names (libcudart.so.13 -> cuda-cudart-13-0) and checked against
the GPU image's list (runtime-packages-gpu.txt); in a build without CUDA none may appear.

What debian:12-slim contains is derived from the dpkg database of this Debian 12 machine: the
image is a debootstrap "minbase" system, i.e. every package of Priority required (apt is one in
Debian 12), every Essential package, and their Depends/Pre-Depends, first alternative first."""
import functools
import os
import pathlib
import re
import subprocess

import pytest

from image_files import BINARIES, DOCKERFILES, PACKAGE_LISTS, parse_dockerfile, read_package_list

BIN = pathlib.Path(os.environ["TANDEM_BIN_DIR"])
BUILD = pathlib.Path(os.environ.get("TANDEM_BUILD_DIR", BIN.parent))
# ldd as in the image: no LD_LIBRARY_PATH or preload from the test's environment.
CLEAN_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}

# CUDA libraries: the name before ".so" -> (the NVIDIA package's stem, whether the soname's major
# version is the toolkit's). The package for CUDA X.Y is "<stem>-X-Y"; a stem without a version
# is a package name itself.
CUDA_LIBRARIES = {
    "libcudart": ("cuda-cudart", True),
    "libcublas": ("libcublas", True),
    "libcublasLt": ("libcublas", True),
    "libnccl": ("libnccl2", None),
}


def is_debian_12():
    try:
        text = pathlib.Path("/etc/os-release").read_text()
    except OSError:
        return False
    return "ID=debian" in text and 'VERSION_ID="12"' in text


pytestmark = pytest.mark.skipif(
    not is_debian_12(),
    reason="the package lists are for Debian 12: this machine's dpkg database is not Debian 12's")


@functools.cache
def ldd(path):
    """[(soname, resolved path or None when not found)] of one ELF file."""
    result = subprocess.run(["ldd", str(path)], capture_output=True, text=True, env=CLEAN_ENV,
                            check=False)
    assert result.returncode == 0, f"ldd {path}: {result.stderr or result.stdout}"
    libraries = []
    for line in result.stdout.splitlines():
        line = line.strip()
        if "=>" in line:
            soname, _, where = line.partition("=>")
            where = where.strip()
            resolved = None if where.startswith("not found") else where.split(" (")[0]
            libraries.append((soname.strip(), resolved))
        elif line.startswith("/"):  # the dynamic loader itself
            path_ = line.split(" (")[0]
            libraries.append((os.path.basename(path_), path_))
        # linux-vdso.so.1 is the kernel's: no file
    return libraries


def package_files(package):
    result = subprocess.run(["dpkg-query", "-L", package], capture_output=True, text=True,
                            env=CLEAN_ENV, check=False)
    assert result.returncode == 0, f"{package} is not installed here: {result.stderr.strip()}"
    return result.stdout.split()


def is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


@functools.cache
def ucx_modules():
    """UCX's transport modules as libucx0 installs them (real files, not their symlinks)."""
    modules = {os.path.realpath(p) for p in package_files("libucx0") if "/ucx/" in p}
    modules = sorted(p for p in modules if os.path.isfile(p) and is_elf(p))
    assert modules, "libucx0 installs no transport modules (expected /usr/lib/<arch>/ucx/*.so.0)"
    return modules


@functools.cache
def image_elf_files():
    missing = [b for b in BINARIES if not (BIN / b).is_file()]
    assert not missing, f"not built in {BIN}: {missing}"
    return [str(BIN / b) for b in BINARIES] + ucx_modules()


def path_variants(path):
    """The names dpkg may know a library file by: as given and its real path, each with and
    without the /usr prefix (Debian 12 merged /lib into /usr/lib; packages use either)."""
    names = {path, os.path.realpath(path)}
    for name in list(names):
        names.add(name[len("/usr"):] if name.startswith("/usr/") else "/usr" + name)
    return sorted(names)


@functools.cache
def owners(paths):
    """{path: {package, ...}} for `paths` (a tuple), from one `dpkg -S` over every variant."""
    variants = {p: path_variants(p) for p in paths}
    everything = sorted({v for vs in variants.values() for v in vs})
    result = subprocess.run(["dpkg", "-S", *everything], capture_output=True, text=True,
                            env=CLEAN_ENV, check=False)
    owned = {}
    for line in result.stdout.splitlines():
        if line.startswith("diversion "):
            continue
        packages, _, path = line.rpartition(": ")
        owned.setdefault(path, set()).update(p.strip().split(":")[0] for p in packages.split(","))
    return {p: set().union(*(owned.get(v, set()) for v in vs)) for p, vs in variants.items()}


@functools.cache
def base_image_packages():
    """What debian:12-slim contains (see the module comment), from the local dpkg database."""
    fields = "${Package}\t${Priority}\t${Essential}\t${Pre-Depends}\t${Depends}\t${Provides}" \
             "\t${db:Status-Abbrev}\n"
    rows = subprocess.run(["dpkg-query", "-W", "-f", fields], capture_output=True, text=True,
                          env=CLEAN_ENV, check=True).stdout.splitlines()
    installed, providers = {}, {}
    for row in rows:
        name, priority, essential, pre_depends, depends, provides, status = row.split("\t")
        if not status.startswith("ii"):
            continue
        installed[name] = (priority, essential, f"{pre_depends}, {depends}")
        for virtual in provides.split(","):
            if virtual.strip():
                providers.setdefault(virtual.split()[0], []).append(name)
    todo = [n for n, (priority, essential, _) in installed.items()
            if priority == "required" or essential == "yes"]
    assert "libc6" not in todo and "apt" in todo, \
        f"unexpected seeds for debian:12-slim (required/essential packages): {sorted(todo)}"
    base = set()
    while todo:
        name = todo.pop()
        if name in base:
            continue
        base.add(name)
        for group in installed[name][2].split(","):
            for alternative in group.split("|"):
                dep = alternative.split()[0].split(":")[0] if alternative.split() else ""
                if dep in installed:
                    todo.append(dep)
                    break
                if dep in providers:
                    todo.append(providers[dep][0])
                    break
    return frozenset(base)


@functools.cache
def build_cuda_version():
    """The CUDA toolkit version build/release was configured with ("13.0.88"), or None."""
    cache = (BUILD / "CMakeCache.txt").read_text()
    state = re.search(r"^TANDEM_CUDA:\w+=(\w+)$", cache, re.M)
    assert state, f"no TANDEM_CUDA in {BUILD / 'CMakeCache.txt'}"
    if state.group(1) == "OFF":
        return None
    for compiler in BUILD.glob("CMakeFiles/*/CMakeCUDACompiler.cmake"):
        version = re.search(r'set\(CMAKE_CUDA_COMPILER_TOOLKIT_VERSION "([\d.]+)"\)',
                            compiler.read_text())
        if version:
            return version.group(1)
    return None


def cuda_library(soname):
    """(library name, soname major) when `soname` is a known CUDA library, else None."""
    match = re.fullmatch(r"(lib\w+)\.so\.(\d+)", soname)
    if match and match.group(1) in CUDA_LIBRARIES:
        return match.group(1), int(match.group(2))
    return None


@functools.cache
def resolved():
    """[(file that needs it, soname, resolved path or None)] over every image ELF file."""
    return [(f, soname, path) for f in image_elf_files() for soname, path in ldd(f)]


@functools.cache
def library_packages():
    """{resolved library path: {package, ...}} for every library that a Debian package owns,
    and the CUDA libraries apart: {soname: [needed by, ...]}."""
    paths = tuple(sorted({p for _, _, p in resolved() if p}))
    owned = owners(paths)
    debian, cuda, unowned = {}, {}, []
    for needer, soname, path in resolved():
        if not path:
            continue
        if owned[path]:
            debian.setdefault(path, (owned[path], []))[1].append(os.path.basename(needer))
        elif cuda_library(soname):
            cuda.setdefault(soname, []).append(os.path.basename(needer))
        else:
            unowned.append(f"{soname} => {path} (needed by {os.path.basename(needer)})")
    assert not unowned, ("libraries that no Debian package owns and that are no known CUDA "
                         "library (add them to CUDA_LIBRARIES with their NVIDIA package):\n"
                         + "\n".join(unowned))
    return debian, cuda


def listed(variant):
    """{package: ListedPackage} of the lists the `variant` image installs."""
    packages = {}
    for path in PACKAGE_LISTS[variant]:
        for package in read_package_list(path):
            assert package.name not in packages, f"{package.name} is in two lists"
            packages[package.name] = package
    return packages


def test_no_library_is_missing():
    missing = [f"{os.path.basename(f)}: {soname}" for f, soname, path in resolved() if not path]
    assert not missing, "ldd finds no file for:\n" + "\n".join(missing)


def test_the_runtime_list_and_the_slim_base_hold_every_library():
    debian, _ = library_packages()
    have = set(listed("cpu")) | base_image_packages()
    lacking = [f"{path} (package {', '.join(sorted(packages))}), needed by "
               f"{', '.join(sorted(set(needers)))}"
               for path, (packages, needers) in sorted(debian.items())
               if not packages & have]
    assert not lacking, ("libraries whose package is neither in runtime-packages.txt nor in "
                         "debian:12-slim:\n" + "\n".join(lacking))


def test_every_listed_package_is_needed():
    debian, _ = library_packages()
    needed = set().union(*(packages for packages, _ in debian.values()))
    base = base_image_packages()
    for package in listed("cpu").values():
        assert package.name not in base, \
            f"runtime-packages.txt:{package.line}: {package.name} is already in debian:12-slim"
        assert package.name in needed or package.run_time_reason, \
            (f"runtime-packages.txt:{package.line}: {package.name} owns no library that the "
             f"binaries or UCX's modules load; drop it, or say why it is needed with a comment "
             f"'# run time: ...'")


def test_cuda_libraries_appear_only_in_a_cuda_build():
    _, cuda = library_packages()
    if build_cuda_version() is None:
        assert not cuda, f"a build without CUDA links CUDA libraries: {cuda}"
    else:
        # A CUDA build links the CUDA runtime (the device helpers in common/).
        assert any(name.startswith("libcudart.so.") for name in cuda), \
            f"a CUDA build ({build_cuda_version()}) that links no libcudart: {cuda}"


def test_the_gpu_list_holds_exactly_the_cuda_libraries():
    version = build_cuda_version()
    if version is None:
        pytest.skip(f"{BUILD} was configured without CUDA: the GPU list is checked against a "
                    f"CUDA build")
    image_version = parse_dockerfile(DOCKERFILES["gpu"]).global_args["CUDA_VERSION"]
    image_major, image_minor = (int(v) for v in image_version.split(".")[:2])
    if int(version.split(".")[0]) != image_major:
        pytest.skip(f"{BUILD} was built with CUDA {version}, the GPU image with CUDA "
                    f"{image_version}: their libraries have other sonames")
    _, cuda = library_packages()
    required = {}
    for soname, needers in cuda.items():
        name, major = cuda_library(soname)
        stem, versioned = CUDA_LIBRARIES[name]
        if versioned:
            assert major == image_major, f"{soname}: not a CUDA {image_major} library"
            package = f"{stem}-{image_major}-{image_minor}"
        else:
            package = stem
        required.setdefault(package, set()).update(needers)
    gpu = {p.name: p for p in read_package_list(PACKAGE_LISTS["gpu"][1])}
    lacking = {p: sorted(n) for p, n in required.items() if p not in gpu}
    assert not lacking, f"CUDA packages missing from runtime-packages-gpu.txt (needed by): {lacking}"
    for package in gpu.values():
        assert package.name in required or package.run_time_reason, \
            (f"runtime-packages-gpu.txt:{package.line}: no binary links a library of "
             f"{package.name}; drop it, or say why with '# run time: ...'")
        versioned = re.fullmatch(r".*-(\d+)-(\d+)", package.name)
        if versioned:
            assert (int(versioned.group(1)), int(versioned.group(2))) == \
                (image_major, image_minor), \
                f"{package.name} is not of CUDA_VERSION {image_version} (Dockerfile.gpu)"
