"""The Kubernetes manifests of deploy/k8s as the deploy tests see them: rendered with `kubectl
kustomize`, and read the way the kubelet reads a pod (a container's environment from its
envFrom ConfigMaps, env entries, downward API fields and $(VAR) references).

kubectl: TANDEM_KUBECTL (several paths separated by ':' are all used where a test compares
renderings, the first for everything else), then `kubectl` on PATH."""
import functools
import os
import pathlib
import re
import shutil
import subprocess

import pytest
import yaml

ROOT = pathlib.Path(os.environ.get("TANDEM_SOURCE_DIR",
                                   pathlib.Path(__file__).resolve().parents[2]))
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ("overlays/cpu", "overlays/gpu", "overlays/tls")
# Every kustomization a user applies: the overlays and the Prometheus operator's objects (plain
# and HTTPS).
MONITORING = ("monitoring", "monitoring-tls")
APPLIED = OVERLAYS + MONITORING
WORKLOAD_KINDS = ("Deployment", "StatefulSet")
# The image's entrypoint runs the binary of its first argument (deploy/docker, the image
# contract).
BINARY_OF_ROLE = {"router": "tandem-router", "prefill": "tandem-prefill",
                  "decode": "tandem-decode"}
ENTRYPOINT = "/opt/tandem/bin/tandem-entrypoint"


def require_kubectl():
    """kubectls(), or the calling test module fails: scripts/setup.sh installs kubectl, so its
    absence is a broken setup, not a reason to skip."""
    found = kubectls()
    if not found:
        pytest.fail("no kubectl: scripts/setup.sh installs Debian's kubernetes-client (or set "
                    "TANDEM_KUBECTL)", pytrace=False)
    return found


def kubectls():
    """The kubectl binaries to render with, first the one to use; duplicates (same file) once."""
    found, seen = [], set()
    listed = [p for p in os.environ.get("TANDEM_KUBECTL", "").split(os.pathsep) if p]
    for path in listed + [shutil.which("kubectl") or ""]:
        if not path:
            continue
        real = os.path.realpath(path)
        if real in seen:
            continue
        if not os.access(real, os.X_OK):
            raise FileNotFoundError(f"TANDEM_KUBECTL names {path}, which is not an executable")
        seen.add(real)
        found.append(path)
    return found


@functools.lru_cache(maxsize=None)
def kubectl_version(kubectl):
    """`kubectl version --client` in one line (kubectl and, where it says, kustomize)."""
    out = subprocess.run([kubectl, "version", "--client"], capture_output=True, text=True,
                         check=False).stdout
    git = re.search(r'GitVersion:"([^"]+)"', out) or re.search(r"Client Version: (\S+)", out)
    kustomize = re.search(r"Kustomize Version: (\S+)", out)
    words = f"kubectl {git.group(1) if git else '?'}"
    return words + (f", kustomize {kustomize.group(1)}" if kustomize else "")


@functools.lru_cache(maxsize=None)
def _render_text(kustomization, kubectl):
    result = subprocess.run([kubectl, "kustomize", str(K8S / kustomization)],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise AssertionError(f"`{kubectl} kustomize deploy/k8s/{kustomization}` failed "
                             f"({result.returncode}):\n{result.stderr}")
    return result.stdout


def render(kustomization, kubectl=None):
    """The objects `kubectl kustomize deploy/k8s/<kustomization>` prints (fresh copies)."""
    kubectl = kubectl or kubectls()[0]
    return [o for o in yaml.safe_load_all(_render_text(kustomization, kubectl)) if o]


def without_nulls(value):
    """`value` with every null-valued key removed, as the API server reads it (kustomize v2
    writes some empty fields as null, e.g. a StatefulSet's volumeClaimTemplates)."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


def by_kind(objects, kind):
    return [o for o in objects if o["kind"] == kind]


def named(objects, kind, name):
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"{len(matches)} {kind} objects named {name}"
    return matches[0]


def config_maps(objects):
    """{name: data} of the rendered ConfigMaps (names with their hash suffix)."""
    return {o["metadata"]["name"]: o.get("data", {}) for o in by_kind(objects, "ConfigMap")}


def workloads(objects):
    return [o for o in objects if o["kind"] in WORKLOAD_KINDS]


def role_of(workload):
    return workload["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]


def main_container(workload):
    """The workload's one container (each pod runs one Tandem process)."""
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, (workload["metadata"]["name"], len(containers))
    return containers[0]


def selects(selector, labels):
    """Whether a label selector (matchLabels / matchExpressions, or a Service's plain map)
    matches `labels`. An empty selector matches nothing here: ours must all say what they
    select."""
    if not selector:
        return False
    if "matchLabels" not in selector and "matchExpressions" not in selector:
        selector = {"matchLabels": selector}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values") or []
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and labels.get(key) in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


# The downward API fields a pod here may read (fieldRef.fieldPath) -> the key of `pod` below.
DOWNWARD_FIELDS = ("metadata.name", "metadata.namespace", "status.podIP")
_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(value, env):
    """Kubernetes' $(VAR) expansion: a reference to a variable defined in `env` becomes its
    value, "$$" becomes "$", and any other reference stays as written."""
    def substitute(match):
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)
    return _REFERENCE.sub(substitute, value)


def container_environment(container, maps, pod):
    """The environment the kubelet gives `container` ({name: value}, in definition order):
    its envFrom ConfigMaps in order, then its env entries (each may use $(VAR) of those before
    it), downward API fields from `pod` ({fieldPath: value} for DOWNWARD_FIELDS). Raises
    AssertionError on a reference that a pod could not resolve (a missing ConfigMap or key, a
    field not in `pod`)."""
    env = {}
    for source in container.get("envFrom", []):
        ref = source.get("configMapRef")
        assert ref is not None, f"envFrom of {container['name']}: only ConfigMaps are used here"
        assert ref["name"] in maps, f"{container['name']}: no ConfigMap {ref['name']}"
        env.update({source.get("prefix", "") + k: v for k, v in maps[ref["name"]].items()})
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = expand(entry["value"], env)
        elif "fieldRef" in (entry.get("valueFrom") or {}):
            path = entry["valueFrom"]["fieldRef"]["fieldPath"]
            assert path in pod, f"{container['name']}: env {entry['name']} reads {path}"
            env[entry["name"]] = pod[path]
        elif "configMapKeyRef" in (entry.get("valueFrom") or {}):
            ref = entry["valueFrom"]["configMapKeyRef"]
            assert ref["key"] in maps.get(ref["name"], {}), (container["name"], ref)
            env[entry["name"]] = maps[ref["name"]][ref["key"]]
        else:
            raise AssertionError(f"{container['name']}: env {entry['name']}: {entry}")
    return env


def container_argv(container, env):
    """command + args, with $(VAR) expanded from `env` as the kubelet does."""
    return [expand(a, env) for a in container.get("command", []) + container.get("args", [])]


def flag_names(binary):
    """The flags a binary defines (from --helpfull), as their TANDEM_* environment names."""
    result = subprocess.run([str(binary), "--helpfull"], capture_output=True, text=True,
                            check=False)
    text = result.stdout + result.stderr
    names = re.findall(r"^\s+--([A-Za-z0-9_]+) \(", text, re.MULTILINE)
    assert names, f"{binary} --helpfull listed no flags:\n{text[:2000]}"
    return {"TANDEM_" + n.upper() for n in names}


def quantity_bytes(quantity):
    """A Kubernetes memory quantity ("1280Mi", "3Gi", "512M", "1000") in bytes."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGTPE]i?)?", str(quantity))
    assert match, f"not a memory quantity: {quantity!r}"
    units = {None: 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
             "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
    return int(float(match.group(1)) * units[match.group(2)])


def quantity_cpus(quantity):
    """A CPU quantity ("4", "500m", "0.5") in cores."""
    text = str(quantity)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)
