"""Reading the container images' build files (deploy/docker): the runtime package lists and the
Dockerfiles, for the image tests (image_*_test.py). A Dockerfile is parsed here with a small line
parser of our own: instructions with their continuation lines joined and comments dropped,
grouped into stages; RUN's --mount options and COPY's options taken apart."""
import dataclasses
import json
import os
import pathlib
import re
import shlex

ROOT = pathlib.Path(os.environ.get("TANDEM_SOURCE_DIR",
                                   pathlib.Path(__file__).resolve().parents[2]))
DOCKER_DIR = ROOT / "deploy" / "docker"
DOCKERFILES = {"cpu": DOCKER_DIR / "Dockerfile.cpu", "gpu": DOCKER_DIR / "Dockerfile.gpu"}
PACKAGE_LISTS = {"cpu": [DOCKER_DIR / "runtime-packages.txt"],
                 "gpu": [DOCKER_DIR / "runtime-packages.txt",
                         DOCKER_DIR / "runtime-packages-gpu.txt"]}
ENTRYPOINT = DOCKER_DIR / "entrypoint.sh"
# The image contract: what /opt/tandem/bin holds.
BINARIES = ["tandem", "tandem-router", "tandem-prefill", "tandem-decode"]
IMAGE_BIN = "/opt/tandem/bin"
IMAGE_ENTRYPOINT = f"{IMAGE_BIN}/tandem-entrypoint"
RUN_TIME_MARK = "run time:"  # a list comment that says why a package no binary links is needed


@dataclasses.dataclass
class ListedPackage:
    name: str
    comment: str  # the comment on its line, without '#'
    line: int

    @property
    def run_time_reason(self):
        """Why it is needed at run time when no binary links it ("" when not said)."""
        if self.comment.lower().startswith(RUN_TIME_MARK):
            return self.comment[len(RUN_TIME_MARK):].strip()
        return ""


def read_package_list(path):
    """The packages of a runtime package list, in order. Raises ValueError on a line that is not
    one package name (with an optional comment) or on a package listed twice."""
    packages, seen = [], set()
    for number, raw in enumerate(pathlib.Path(path).read_text().splitlines(), 1):
        text, _, comment = raw.partition("#")
        words = text.split()
        if not words:
            continue
        if len(words) != 1 or not re.fullmatch(r"[a-z0-9][a-z0-9+.-]+", words[0]):
            raise ValueError(f"{path}:{number}: expected one Debian package name, got {raw!r}")
        if words[0] in seen:
            raise ValueError(f"{path}:{number}: {words[0]} is listed twice")
        seen.add(words[0])
        packages.append(ListedPackage(words[0], comment.strip(), number))
    return packages


@dataclasses.dataclass
class Instruction:
    keyword: str  # upper case: FROM, RUN, COPY, ...
    text: str     # the rest, continuation lines joined with single spaces
    line: int     # where it starts (1-based)

    def json_args(self):
        """The exec (JSON array) form's arguments; None for the shell form."""
        try:
            value = json.loads(self.text)
        except ValueError:
            return None
        return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else None


@dataclasses.dataclass
class Run:
    mounts: list   # [{"type": "bind", "source": ..., "target": ..., "from": ...}, ...]
    command: str   # the shell command after the options


@dataclasses.dataclass
class Copy:
    options: dict  # {"from": "build", "chown": ...}
    sources: list
    dest: str


@dataclasses.dataclass
class Stage:
    base: str      # the FROM argument as written, e.g. ${DEBIAN_SLIM_IMAGE}
    name: str      # the AS name ("" when none)
    instructions: list

    def all(self, keyword):
        return [i for i in self.instructions if i.keyword == keyword]

    def runs(self):
        return [parse_run(i) for i in self.all("RUN")]

    def copies(self):
        return [parse_copy(i) for i in self.all("COPY")]

    def args(self):
        """Names of the ARGs declared in this stage (which brings global ARGs into it)."""
        return [i.text.split("=")[0].strip() for i in self.all("ARG")]


@dataclasses.dataclass
class Dockerfile:
    path: pathlib.Path
    global_args: dict  # ARG name -> default ("" when none), declared before the first FROM
    stages: list

    def stage(self, name):
        matches = [s for s in self.stages if s.name == name]
        assert len(matches) == 1, f"{self.path}: {len(matches)} stages named {name!r}"
        return matches[0]

    @property
    def final(self):
        return self.stages[-1]

    def resolve(self, text):
        """`text` with ${NAME} and $NAME of the global ARGs replaced by their defaults."""
        return re.sub(r"\$\{(\w+)\}|\$(\w+)",
                      lambda m: self.global_args.get(m.group(1) or m.group(2), m.group(0)), text)


def instructions(path):
    """The instructions of a Dockerfile, comments and blank lines dropped, continuations joined
    (a comment line inside a continuation is dropped, as Docker does)."""
    result, parts, start = [], [], 0
    for number, raw in enumerate(pathlib.Path(path).read_text().splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not parts):
            continue
        if not parts:
            start = number
        continued = stripped.endswith("\\")
        parts.append(stripped[:-1].strip() if continued else stripped)
        if not continued:
            joined = " ".join(p for p in parts if p)
            keyword, _, rest = joined.partition(" ")
            result.append(Instruction(keyword.upper(), rest.strip(), start))
            parts = []
    if parts:
        raise ValueError(f"{path}:{start}: the file ends inside a continued instruction")
    return result


def parse_dockerfile(path):
    global_args, stages = {}, []
    for instruction in instructions(path):
        if instruction.keyword == "FROM":
            words = instruction.text.split()
            options = [w for w in words if w.startswith("--")]
            words = [w for w in words if not w.startswith("--")]
            assert not options or all(o.startswith("--platform=") for o in options), instruction
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else ""
            assert len(words) in (1, 3), f"{path}:{instruction.line}: unexpected FROM {words}"
            stages.append(Stage(words[0], name, []))
        elif not stages:
            assert instruction.keyword == "ARG", \
                f"{path}:{instruction.line}: only ARG may come before the first FROM"
            name, _, default = instruction.text.partition("=")
            global_args[name.strip()] = default.strip()
        else:
            stages[-1].instructions.append(instruction)
    return Dockerfile(pathlib.Path(path), global_args, stages)


def _options(text):
    """Leading --name=value options of an instruction's text, and the rest."""
    options = []
    while text.startswith("--"):
        option, _, text = text.partition(" ")
        options.append(option)
        text = text.lstrip()
    return options, text


def parse_run(instruction):
    options, command = _options(instruction.text)
    mounts = []
    for option in options:
        name, _, value = option[2:].partition("=")
        assert name == "mount", f"line {instruction.line}: unexpected RUN option {option}"
        mounts.append(dict(field.split("=", 1) for field in value.split(",")))
    return Run(mounts, command)


def parse_copy(instruction):
    options, rest = _options(instruction.text)
    words = shlex.split(rest)
    assert len(words) >= 2, f"line {instruction.line}: COPY needs a source and a destination"
    return Copy({o[2:].partition("=")[0]: o.partition("=")[2] for o in options}, words[:-1],
                words[-1])


def shell_commands(command):
    """The simple commands of a RUN's shell command, split at &&, ||, ; and newlines (enough for
    the Dockerfiles here, which use no nested quoting of these)."""
    return [c.strip() for c in re.split(r"&&|\|\||;", command) if c.strip()]
