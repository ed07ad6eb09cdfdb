"""The images' entrypoint (deploy/docker/entrypoint.sh) starts each role from environment
variables and a mounted model only, the way a Kubernetes pod starts it.

Each role runs as a "pod": in a network namespace of its own (tests/netns: a host on a bridge),
with a hostname of its own and a root file system of its own, in which the repository's models/
folder is bind-mounted read-only at /models, as the model volume is in a pod. That root is a tmpfs
made in a private mount namespace, holding bind mounts of the machine's top-level folders and the
/models mount point, entered with chroot: nothing is created or changed on the machine's own file
system. The entrypoint runs under `env -i` with PATH, HOME, TANDEM_BIN_DIR (build/release/bin)
and, for configuration, TANDEM_* variables only; the contract's default ports and model folder
are used as they are. The test then checks each worker's gRPC health (SERVING) and /metrics,
the router's /health, one chat completion across the pods (prefilled in the prefill pod, its KV
moved to the decode pod over UCX), that the binary has replaced the entrypoint (the pid that
was started runs the binary) with only the contract's environment, and that SIGTERM to that pid
stops the binary cleanly.

Faster cases run the entrypoint directly: an unknown or missing role exits 2 with a message, a
missing model exits 1 naming what to mount or set, and flags after the role reach the binary."""
import functools
import os
import pathlib
import re
import shutil
import signal
import subprocess
import tempfile

import pytest

from cluster_common import grpc_health, http_request, wait_until
from image_files import ENTRYPOINT, ROOT
from netns_hosts import Network, unavailable_reason

BIN = pathlib.Path(os.environ["TANDEM_BIN_DIR"])
MODELS = ROOT / "models"
DEFAULT_MODEL = re.search(r'kDefaultModelFile = "([^"]+)"',
                          (ROOT / "engine" / "model" / "model_path.h").read_text()).group(1)
POD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The contract's ports (deploy/docker/entrypoint.sh).
ROUTER_HTTP, ROUTER_GRPC, WORKER_GRPC, WORKER_METRICS = 8000, 7000, 7100, 9100

# A pod's root file system: $1 an empty folder to mount it on, $2 the pod's hostname, $3 the
# folder to mount read-only at /models ("" for no /models at all); the rest is the command, run
# with the new root. Runs in a private mount and UTS namespace (unshare).
POD_ROOT = r"""
set -eu
root=$1 name=$2 models=$3
shift 3
hostname "$name"
mount -t tmpfs -o mode=0755,size=1m tandem-pod-root "$root"
for entry in /*; do
  top=${entry#/}
  [ "$top" != models ] || continue
  if [ -L "$entry" ]; then
    ln -s "$(readlink "$entry")" "$root/$top"
  elif [ -d "$entry" ]; then
    mkdir "$root/$top"
    mount --rbind "$entry" "$root/$top"
  fi
done
if [ -n "$models" ]; then
  mkdir "$root/models"
  mount --bind "$models" "$root/models"
  mount -o remount,bind,ro "$root/models"
fi
exec chroot "$root" "$@"
"""


def pod_argv(root, name, models, command):
    """`command` run as in a pod named `name` whose root is mounted on the empty folder `root`,
    with `models` at /models (None: no /models). Each step execs the next: the command keeps the
    pid of the process started with this argv."""
    return ["unshare", "--mount", "--uts", "--propagation", "private", "sh", "-c", POD_ROOT,
            "tandem-pod", str(root), name, str(models or ""), *command]


def entrypoint_argv(args, env):
    """The entrypoint with `args`, in an environment of exactly PATH, HOME, TANDEM_BIN_DIR and
    `env`."""
    full = {"PATH": POD_PATH, "HOME": "/tmp", "TANDEM_BIN_DIR": str(BIN), **env}
    return ["env", "-i", *[f"{k}={v}" for k, v in full.items()], str(ENTRYPOINT), *args]


def run_entrypoint(args, env, timeout=60):
    return subprocess.run(entrypoint_argv(args, env), capture_output=True, text=True,
                          timeout=timeout, check=False)


@functools.cache
def pods_unavailable():
    """Why this machine cannot make pod roots (for a skip), or None."""
    if os.geteuid() != 0:
        return f"pod roots need root for mount namespaces (running as uid {os.geteuid()})"
    for tool in ("unshare", "chroot", "mount", "hostname"):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed"
    probe = pathlib.Path(tempfile.mkdtemp(prefix="tandem-pod-probe-"))
    try:
        result = subprocess.run(pod_argv(probe, "probe", MODELS, ["test", "-r",
                                                                  f"/models/{DEFAULT_MODEL}"]),
                                capture_output=True, text=True, timeout=30, check=False)
    finally:
        probe.rmdir()
    if result.returncode != 0:
        return f"a private mount namespace with a chroot could not be made: {result.stderr.strip()}"
    return None


@pytest.fixture(scope="module", autouse=True)
def model_is_there():
    assert (MODELS / DEFAULT_MODEL).is_file(), \
        f"the default model {MODELS / DEFAULT_MODEL} is missing: run scripts/setup.sh"


def test_the_entrypoint_names_the_default_model_of_the_binaries():
    assert f"default_model_file={DEFAULT_MODEL}\n" in ENTRYPOINT.read_text()


@pytest.mark.parametrize("args, env, message", [
    (["worker"], {}, "unknown role 'worker'"),
    ([], {"TANDEM_ROLE": "gateway"}, "unknown role 'gateway' in TANDEM_ROLE"),
    ([], {}, "no role: give router, prefill or decode"),
    (["--listen=127.0.0.1:0"], {}, "no role: give router, prefill or decode"),
])
def test_a_missing_or_unknown_role_exits_2_with_a_message(args, env, message):
    result = run_entrypoint(args, {"TANDEM_MODELS_DIR": str(MODELS), **env})
    assert result.returncode == 2, result
    assert result.stderr.startswith(f"tandem-entrypoint: {message}"), result.stderr
    assert "starting" not in result.stderr  # no binary ran


def test_a_missing_model_exits_1_and_says_what_to_mount_or_set(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    missing = tmp_path / "missing.gguf"
    cases = [
        (["decode"], {"TANDEM_MODEL": str(missing)},
         f"model file {missing} (TANDEM_MODEL) does not exist: mount the model volume"),
        (["prefill"], {"TANDEM_MODEL": str(empty)},
         f"model {empty} (TANDEM_MODEL) is not a regular file"),
        (["router"], {"TANDEM_MODELS_DIR": str(empty)},
         f"model folder {empty} (TANDEM_MODELS_DIR) has no {DEFAULT_MODEL}"),
        (["decode"], {"TANDEM_MODELS_DIR": str(tmp_path / "nowhere")},
         f"model folder {tmp_path / 'nowhere'} (TANDEM_MODELS_DIR) does not exist"),
        # The command line wins over the environment, in the check as in the binary.
        (["decode", f"--model={missing}"], {"TANDEM_MODELS_DIR": str(MODELS)},
         f"model file {missing} (--model) does not exist"),
        (["decode", "--models_dir", str(empty)], {"TANDEM_MODELS_DIR": str(MODELS)},
         f"model folder {empty} (--models_dir) has no {DEFAULT_MODEL}"),
    ]
    for args, env, message in cases:
        result = run_entrypoint(args, env)
        assert result.returncode == 1, (args, env, result)
        assert result.stderr.startswith(f"tandem-entrypoint: {message}"), result.stderr


def test_without_the_model_volume_the_error_names_slash_models(tmp_path):
    reason = pods_unavailable()
    if reason:
        pytest.skip(reason)
    argv = pod_argv(tmp_path, "no-volume", None, entrypoint_argv(["decode"], {}))
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 1, result
    assert result.stderr.startswith(
        "tandem-entrypoint: model folder /models (the default model folder) does not exist: "
        "mount the model volume at /models"), result.stderr


def test_flags_after_the_role_reach_the_binary():
    result = run_entrypoint(["decode", "--no_such_flag=1"], {"TANDEM_MODELS_DIR": str(MODELS)})
    assert result.returncode != 0
    assert "tandem-entrypoint: starting tandem-decode" in result.stderr
    # Only the binary knows its flags: this is its complaint, not the entrypoint's.
    assert re.search(r"[Uu]nknown command line flag 'no_such_flag'", result.stderr), result.stderr


def test_the_entrypoint_is_posix_sh():
    """It runs as the image's /bin/sh (dash in debian:12-slim, as here) and the same under bash
    in POSIX mode; shellcheck, where installed, finds nothing outside POSIX sh."""
    for shell in (["dash"], ["bash", "--posix"]):
        argv = entrypoint_argv(["decode", "--no_such_flag=1"], {"TANDEM_MODELS_DIR": str(MODELS)})
        at = argv.index(str(ENTRYPOINT))
        result = subprocess.run(argv[:at] + shell + argv[at:], capture_output=True, text=True,
                                timeout=60, check=False)
        assert "tandem-entrypoint: starting tandem-decode" in result.stderr, (shell, result)
        assert "no_such_flag" in result.stderr, (shell, result)
    if shutil.which("shellcheck") is None:
        return  # the runs above are the check
    result = subprocess.run(["shellcheck", "--shell=sh", str(ENTRYPOINT)], capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stdout


def test_a_missing_binary_exits_1(tmp_path):
    result = run_entrypoint(["router"], {"TANDEM_BIN_DIR": str(tmp_path),
                                         "TANDEM_MODELS_DIR": str(MODELS)})
    assert result.returncode == 1
    assert result.stderr.startswith(f"tandem-entrypoint: {tmp_path}/tandem-router is missing")


# --------------------------------------------------------------------------------------------
# The three roles as pods.
# --------------------------------------------------------------------------------------------

# Configuration through TANDEM_* variables only, as a ConfigMap gives it. KV moves between the
# pods over UCX's TCP transport.
WORKER_ENV = {"TANDEM_THREADS": "1", "TANDEM_KV_CACHE_MB": "64", "TANDEM_UCX_TLS": "tcp"}
ROUTER_ENV = {"TANDEM_LOCAL_PREFILL_THRESHOLD": "16"}


def metric_sum(text, name):
    """The sum of a metric's samples (over its labels) in Prometheus text format."""
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " "))


def same_file(a, b):
    sa, sb = os.stat(a), os.stat(b)
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def process_environment(pid):
    raw = pathlib.Path(f"/proc/{pid}/environ").read_bytes()
    return dict(e.split("=", 1) for e in raw.decode().split("\0") if e)


def assert_is_the_binary(pod, binary, given_env, added_env):
    """The process started for `pod` is now `binary` itself (the chain unshare, sh, chroot, env,
    entrypoint exec'd all the way) with exactly the given environment, less TANDEM_ROLE and
    TANDEM_BIN_DIR, plus what the entrypoint adds."""
    pid = pod.proc.pid
    assert same_file(f"/proc/{pid}/exe", BIN / binary), \
        f"pid {pid} runs {os.readlink(f'/proc/{pid}/exe')}, not {binary}"
    expected = {"PATH": POD_PATH, "HOME": "/tmp", **given_env, **added_env}
    expected.pop("TANDEM_ROLE", None)
    environment = process_environment(pid)
    assert environment.pop("PWD", "/") == "/"  # the shell's own
    assert environment == expected


@pytest.fixture()
def network():
    reason = unavailable_reason() or pods_unavailable()
    if reason:
        pytest.skip(reason)
    with Network(["router", "prefill", "decode"]) as net:
        yield net
    assert not net.leftovers()


def test_the_roles_run_as_pods_from_environment_variables_and_the_model_volume(network,
                                                                               tmp_path):
    net = network
    pods = {}
    given = {}
    for role, args, env in [
        ("prefill", ["prefill"], WORKER_ENV),
        ("decode", [], {**WORKER_ENV, "TANDEM_ROLE": "decode"}),  # the role from the environment
    ]:
        root = tmp_path / role
        root.mkdir()
        given[role] = env
        pods[role] = net[role].run(pod_argv(root, f"{role}-pod", MODELS,
                                            entrypoint_argv(args, env)), timeout=180)
    workers = ",".join(f"{net[r].ip}:{WORKER_GRPC}" for r in ("prefill", "decode"))
    given["router"] = {**ROUTER_ENV, "TANDEM_WORKERS": workers, "TANDEM_POLICY": "round_robin"}
    (tmp_path / "router").mkdir()
    # A flag after the role passes through and wins over the environment.
    pods["router"] = net["router"].run(
        pod_argv(tmp_path / "router", "router-pod", MODELS,
                 entrypoint_argv(["router", "--policy=least_loaded"], given["router"])),
        timeout=180)

    # The contract's ports and model folder, set by the entrypoint.
    for role in ("prefill", "decode"):
        assert pods[role].port == WORKER_GRPC, pods[role].log
        assert_is_the_binary(pods[role], f"tandem-{role}", given[role],
                             {"TANDEM_MODELS_DIR": "/models",
                              "TANDEM_LISTEN": f"0.0.0.0:{WORKER_GRPC}",
                              "TANDEM_METRICS_LISTEN": f"0.0.0.0:{WORKER_METRICS}"})
        worker = f"127.0.0.1:{net[role].forward(WORKER_GRPC)}"
        assert grpc_health(worker, timeout=10) == 1  # SERVING
        status, body = net[role].http_get(WORKER_METRICS, "/metrics")
        assert status == 200 and "# TYPE" in body, (status, body[:200])
    router = pods["router"]
    assert router.port == ROUTER_GRPC
    assert router.find(rf"listening on port {ROUTER_GRPC} \(http port {ROUTER_HTTP}, "
                       r"policy least_loaded"), router.log
    assert_is_the_binary(router, "tandem-router", given["router"],
                         {"TANDEM_MODELS_DIR": "/models",
                          "TANDEM_LISTEN": f"0.0.0.0:{ROUTER_GRPC}",
                          "TANDEM_HTTP_LISTEN": f"0.0.0.0:{ROUTER_HTTP}"})

    # The router finds both workers, by the names their pods' hostnames and ports give them.
    wait_until(lambda: router.find(r"prefill-pod:7100 at .* joined \(") and
               router.find(r"decode-pod:7100 at .* joined \("), timeout=60,
               what=f"both workers to join the router:\n{''.join(router.log[-20:])}")
    http = net["router"].forward(ROUTER_HTTP)
    wait_until(lambda: http_request(http, "GET", "/health", timeout=5)[0] == 200, timeout=60,
               what="the router's GET /health to answer 200")
    status, body = http_request(http, "POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Name three colours of the rainbow."}],
        "max_tokens": 8, "temperature": 0})
    assert status == 200, body
    assert body["choices"][0]["message"]["content"].strip(), body
    assert body["usage"]["completion_tokens"] > 0, body
    # The prompt (over the router's 16-token threshold) was prefilled in the prefill pod and its
    # KV written into the decode pod over UCX, with the addresses the contract's defaults give.
    status, metrics = net["prefill"].http_get(WORKER_METRICS, "/metrics")
    assert status == 200 and metric_sum(metrics, "tandem_prefill_transfer_bytes_total") > 0, \
        [l for l in metrics.splitlines() if l.startswith("tandem_prefill")]

    # SIGTERM to the pid that was started reaches the binary, which shuts down cleanly (a shell
    # in between would have been killed by it instead: returncode -15).
    for role in ("router", "decode", "prefill"):
        pods[role].proc.send_signal(signal.SIGTERM)
        assert pods[role].proc.wait(timeout=60) == 0, "".join(pods[role].log[-20:])
