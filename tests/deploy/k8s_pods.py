"""Rendered Kubernetes workloads run as processes: one network namespace per pod (replicas
included), the way a kubelet would start them, on one machine and without a cluster.

    pods = PodCluster(k8s_render.render("overlays/cpu"), namespace="tandem",
                      image_paths={"/opt/tandem/bin/tandem-entrypoint": ENTRYPOINT},
                      mounts={"/models": ROOT / "models"}, extra_env={...}, overrides={...})
    pods.start()                    # every pod at once; waits for startup and readiness probes
    pods.endpoints("tandem-router") # the Service's pods
    pods.close()

What is taken from the manifests, unchanged: each container's command and args ($(VAR)
expanded), its environment (envFrom ConfigMaps, env values, downward API metadata.name,
metadata.namespace and status.podIP), the replicas, the Services' selectors (DNS), the probes
(run against the pod's address from a "node" namespace, as the kubelet does: an HTTPS probe
without checking the certificate), and the pod's
securityContext as far as a process has one (runAsUser, runAsGroup, fsGroup as a supplementary
group, allowPrivilegeEscalation false as no_new_privs, dropped capabilities; setpriv(1)).

What is mapped to this machine, and only through the arguments:
  image_paths  a path in the image -> the file here (the image's entrypoint script)
  mounts       a volume's mountPath -> the folder here that holds its content (env values under
               a mountPath are rewritten; every other volume is an emptyDir: a fresh folder)
  secrets      a Secret's name -> the folder here whose files are its keys: a Secret volume of
               it gets a folder of its own per pod holding its items (key -> path, or every
               key), with the volume's defaultMode, as the kubelet writes them
  extra_env    variables the image itself would set (TANDEM_BIN_DIR: where the binaries are)
  overrides    env values replaced (each must exist in the manifest): sizes for a small machine
Not emulated: readOnlyRootFilesystem (no mount namespace), resource limits, init containers
(the model is already in `mounts`), restarts. The WORKDIR is the pod's fresh work folder.

DNS: `ip netns exec` bind-mounts /etc/netns/<namespace>/hosts over /etc/hosts for the process
it starts (iproute2), so each pod gets a hosts file in which every Service's name,
<service>.<namespace>.svc.cluster.local, has one line per selected pod: getaddrinfo returns every
replica's address, as a headless Service's DNS does (publishNotReadyAddresses: all of them,
ready or not). A ClusterIP Service has no virtual address here: its name lists its pods too.
The hosts files are removed at close(). resolv.conf points at 127.0.0.1, where nothing answers,
so that a name not in the file never leaves the namespace.

Needs root, iproute2 and setpriv (util-linux); see netns_hosts.unavailable_reason()."""
import http.client
import os
import pathlib
import re
import shutil
import signal
import ssl
import tempfile

import grpc
import pytest

import netns_hosts
from netns_hosts import Network
from k8s_render import (by_kind, config_maps, container_argv, container_environment,
                        main_container, require_kubectl, role_of, selects, workloads)

CLUSTER_DOMAIN = "svc.cluster.local"
_ETC_NETNS = pathlib.Path("/etc/netns")
# The image's PATH (Debian's default).
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def unavailable_reason():
    """None when pods can run here; else why not (for pytest.skip)."""
    reason = netns_hosts.unavailable_reason()
    if reason:
        return reason
    for tool in ("setpriv", "env"):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed"
    return None


def require_pods():
    """At the top of a test module that runs pods: skips it, saying why, where they cannot run
    here; fails it without kubectl."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"pods cannot run here: {reason}", allow_module_level=True)
    require_kubectl()


def remove_stale_hosts_files():
    """The /etc/netns folders of earlier runs whose namespace is gone (a run killed by SIGKILL
    leaves them); only names of netns_hosts' prefix."""
    if not _ETC_NETNS.is_dir():
        return
    for folder in _ETC_NETNS.iterdir():
        if re.fullmatch(rf"{netns_hosts.PREFIX}\d+-[\w.-]+", folder.name) and \
                not pathlib.Path("/run/netns", folder.name).exists():
            shutil.rmtree(folder, ignore_errors=True)


class Pod:
    """One replica of a workload: its host (network namespace), its container's argv and
    environment as the kubelet would give them, and its process once started."""

    def __init__(self, workload, index, name):
        self.workload = workload
        self.index = index
        self.name = name
        self.role = role_of(workload)
        self.spec = workload["spec"]["template"]["spec"]
        self.container = main_container(workload)
        self.labels = workload["spec"]["template"]["metadata"]["labels"]
        self.ports = {p["name"]: p["containerPort"] for p in self.container.get("ports", [])}
        self.host = None
        self.env = None
        self.argv = None
        self.process = None

    def __repr__(self):
        return f"Pod({self.name}, {self.host.ip if self.host else '-'})"

    @property
    def ip(self):
        return self.host.ip

    def log(self, lines=40):
        return "".join(self.process.log[-lines:]) if self.process else "(not started)"

    def alive(self):
        return self.process is not None and self.process.alive()

    def kill(self, sig=signal.SIGKILL):
        """Sends `sig` to the container's process (setpriv, env, the entrypoint and `ip netns
        exec` each exec the next: the pid is the binary's)."""
        os.kill(self.process.proc.pid, sig)


class PodCluster:
    """The pods of `objects`' workloads in namespace `namespace`, plus a host "node" from which
    probes and the test's clients reach them. See the module comment. Not thread-safe."""

    def __init__(self, objects, namespace, image_paths, mounts, extra_env=None, overrides=None,
                 secrets=None):
        self.objects = objects
        self.namespace = namespace
        self.image_paths = {k: str(v) for k, v in image_paths.items()}
        self.mounts = {k: str(v) for k, v in mounts.items()}
        self.secrets = {k: pathlib.Path(v) for k, v in (secrets or {}).items()}
        self.extra_env = dict(extra_env or {})
        self.overrides = dict(overrides or {})
        self.maps = config_maps(objects)
        self.pods = []
        for workload in workloads(objects):
            name = workload["metadata"]["name"]
            for i in range(workload["spec"].get("replicas", 1)):
                # StatefulSet pods are <name>-<ordinal>; a Deployment's get a random suffix.
                pod_name = f"{name}-{i}" if workload["kind"] == "StatefulSet" else \
                    f"{name}-rs-{i}"
                self.pods.append(Pod(workload, i, pod_name))
        self._overridden = set()
        self._channels = {}
        self._folder = None
        self._hosts_files = []
        self.net = None

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self, limit_s=None):
        """Makes the namespaces and hosts files, starts every pod's process at once, and waits
        for each pod's startup probe, then its readiness probe (each within the time the probe
        allows, at most `limit_s`)."""
        remove_stale_hosts_files()
        self.net = Network(["node"] + [p.name for p in self.pods])
        try:
            self.node = self.net["node"]
            for pod in self.pods:
                pod.host = self.net[pod.name]
            self._folder = tempfile.mkdtemp(prefix="tandem-pods-")
            os.chmod(self._folder, 0o755)
            self._write_hosts_files()
            for pod in self.pods:
                self._prepare(pod)
            unused = set(self.overrides) - self._overridden
            assert not unused, f"overrides of variables no pod has: {sorted(unused)}"
            for pod in self.pods:
                self._launch(pod)
            for pod in self.pods:
                self.await_probe(pod, "startupProbe", limit_s)
            for pod in self.pods:
                self.await_probe(pod, "readinessProbe", limit_s)
        except BaseException:
            self.close()
            raise
        return self

    def close(self):
        """Kills every process, deletes the namespaces, the hosts files and the pods' folders."""
        for channel in self._channels.values():
            channel.close()
        self._channels = {}
        if self.net is not None:
            self.net.close()
        for folder in self._hosts_files:
            shutil.rmtree(folder, ignore_errors=True)
        self._hosts_files = []
        try:
            _ETC_NETNS.rmdir()  # only when empty: other runs' files stay
        except OSError:
            pass
        if self._folder:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- what a kubelet does ----------------------------------------------------------------------

    def _dns_records(self):
        """[(ip, name)] of every Service's name (and each StatefulSet pod's own name)."""
        records = []
        for service in by_kind(self.objects, "Service"):
            fqdn = f"{service['metadata']['name']}.{self.namespace}.{CLUSTER_DOMAIN}"
            for pod in self.endpoints(service["metadata"]["name"]):
                records.append((pod.ip, fqdn))
                if pod.workload["kind"] == "StatefulSet" and \
                        pod.workload["spec"].get("serviceName") == service["metadata"]["name"]:
                    records.append((pod.ip, f"{pod.name}.{fqdn}"))
        return records

    def _write_hosts_files(self):
        records = self._dns_records()
        for pod in self.pods:
            folder = _ETC_NETNS / pod.host.netns
            folder.mkdir(parents=True, exist_ok=True)
            self._hosts_files.append(folder)
            lines = ["127.0.0.1 localhost", f"{pod.ip} {pod.name}"]
            lines += [f"{ip} {name}" for ip, name in records]
            (folder / "hosts").write_text("\n".join(lines) + "\n")
            (folder / "resolv.conf").write_text(
                f"nameserver 127.0.0.1\nsearch {self.namespace}.{CLUSTER_DOMAIN} "
                f"{CLUSTER_DOMAIN}\noptions ndots:5 attempts:1 timeout:1\n")

    def _prepare(self, pod):
        fields = {"metadata.name": pod.name, "metadata.namespace": self.namespace,
                  "status.podIP": pod.ip}
        env = container_environment(pod.container, self.maps, fields)
        for name, value in self.overrides.items():
            if name in env:
                env[name] = value
                self._overridden.add(name)
        local = dict(self.mounts)
        pod_folder = pathlib.Path(self._folder, pod.name)
        volumes = {v["name"]: v for v in pod.spec.get("volumes", [])}
        modes = []
        for mount in pod.container.get("volumeMounts", []):
            secret = volumes.get(mount["name"], {}).get("secret")
            if secret is None:
                continue
            assert secret["secretName"] in self.secrets, \
                f"{pod.name}: no content for the Secret {secret['secretName']}"
            source = self.secrets[secret["secretName"]]
            path = pod_folder / mount["name"]
            path.mkdir(parents=True, exist_ok=True)
            items = secret.get("items") or [{"key": f.name, "path": f.name}
                                             for f in source.iterdir()]
            for item in items:
                shutil.copyfile(source / item["key"], path / item["path"])
                modes.append((path / item["path"], item.get("mode", secret.get("defaultMode",
                                                                                0o644))))
            local[mount["mountPath"]] = str(path)
        for mount in pod.container.get("volumeMounts", []):
            if mount["mountPath"] not in local and mount["mountPath"] != "/dev/shm":
                path = pod_folder / mount["name"]
                path.mkdir(parents=True, exist_ok=True)
                local[mount["mountPath"]] = str(path)
        for name, value in env.items():
            for path, here in local.items():
                if value == path or value.startswith(path + "/"):
                    env[name] = here + value[len(path):]
        # The kubelet sets HOSTNAME; the image sets PATH.
        pod.env = {"PATH": IMAGE_PATH, "HOSTNAME": pod.name, **self.extra_env, **env}
        argv = container_argv(pod.container, pod.env)
        assert argv, f"{pod.name}: the manifest gives no command (the image's would run)"
        assert argv[0] in self.image_paths, f"{pod.name}: {argv[0]} has no file here"
        pod.argv = [self.image_paths[argv[0]]] + argv[1:]
        pod.workdir = pod_folder / "workdir"
        pod.workdir.mkdir(parents=True, exist_ok=True)
        security = pod.spec.get("securityContext", {})
        for path in [pod_folder, *pod_folder.rglob("*")]:
            os.chown(path, security.get("runAsUser", 0), security.get("fsGroup", 0))
        for path, mode in modes:
            os.chmod(path, mode)

    def _security(self, pod):
        """setpriv(1) arguments for the pod's and container's securityContext."""
        pod_sc = pod.spec.get("securityContext", {})
        sc = {**pod_sc, **pod.container.get("securityContext", {})}
        user, group = sc.get("runAsUser"), sc.get("runAsGroup")
        assert user is not None and group is not None, f"{pod.name}: no runAsUser/runAsGroup"
        if sc.get("runAsNonRoot"):
            assert user != 0, f"{pod.name}: runAsNonRoot with runAsUser 0"
        args = [shutil.which("setpriv"), f"--reuid={user}", f"--regid={group}"]
        groups = [str(g) for g in [pod_sc.get("fsGroup")] + pod_sc.get("supplementalGroups", [])
                  if g is not None]
        args.append(f"--groups={','.join(groups)}" if groups else "--clear-groups")
        if sc.get("allowPrivilegeEscalation") is False:
            args.append("--no-new-privs")
        caps = sc.get("capabilities", {})
        if "ALL" in caps.get("drop", []):
            added = "".join(f",+{c.lower()}" for c in caps.get("add", []))
            args += [f"--bounding-set=-all{added}", f"--inh-caps=-all{added}"]
        return args

    def _launch(self, pod):
        argv = self._security(pod) + ["--", shutil.which("env"), "-i", "-C", str(pod.workdir)]
        argv += [f"{k}={v}" for k, v in pod.env.items()] + pod.argv
        pod.process = pod.host.run(argv, ready=netns_hosts.TANDEM_READY, wait=False)

    # -- probes ---------------------------------------------------------------------------------

    def _channel(self, pod, port):
        key = (pod.name, port)
        if key not in self._channels:
            forwarded = self.node.forward(port, ip=pod.ip)
            self._channels[key] = grpc.insecure_channel(f"127.0.0.1:{forwarded}")
        return self._channels[key]

    def grpc_health(self, pod, port, service="", timeout=1.0):
        """grpc.health.v1.Health/Check of `service` at the pod's port: True when SERVING."""
        check = self._channel(pod, port).unary_unary(
            "/grpc.health.v1.Health/Check", request_serializer=lambda b: b,
            response_deserializer=lambda b: b)
        # HealthCheckRequest{service} by hand: field 1, length-delimited.
        request = b"" if not service else b"\x0a" + bytes([len(service)]) + service.encode()
        try:
            return check(request, timeout=timeout) == b"\x08\x01"  # status: SERVING (1)
        except grpc.RpcError:
            return False

    def probe(self, pod, kind):
        """One run of the pod's probe `kind` (startupProbe, readinessProbe, livenessProbe), as
        the kubelet runs it from the node: True when it succeeds."""
        spec = pod.container[kind]
        timeout = spec.get("timeoutSeconds", 1)
        if "grpc" in spec:
            return self.grpc_health(pod, spec["grpc"]["port"], spec["grpc"].get("service", ""),
                                    timeout)
        if "httpGet" in spec:
            port = spec["httpGet"]["port"]
            port = pod.ports[port] if isinstance(port, str) else port
            if spec["httpGet"].get("scheme", "HTTP") == "HTTPS":
                # As the kubelet does: TLS without checking the certificate.
                context = ssl.create_default_context()
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
                status, _ = self.https_get(pod, port, spec["httpGet"].get("path", "/"), context,
                                           timeout=timeout)
            else:
                status, _ = self.node.http_get(port, spec["httpGet"].get("path", "/"),
                                               ip=pod.ip, timeout=timeout)
            return 200 <= status < 400
        if "tcpSocket" in spec:
            port = spec["tcpSocket"]["port"]
            try:
                self.node.connect(pod.ip, pod.ports.get(port, port), timeout=timeout).close()
                return True
            except OSError:
                return False
        raise AssertionError(f"{pod.name} {kind}: {spec}")

    def https_get(self, pod, port, path, context, server_hostname=None, headers=None,
                  timeout=5):
        """(status, body text) of GET https://<pod>:port/path from the node, over `context`
        (checking `server_hostname` when the context checks names); (0, error) when it fails."""
        try:
            raw = self.node.connect(pod.ip, port, timeout=timeout)
            sock = context.wrap_socket(raw, server_hostname=server_hostname)
        except (OSError, ssl.SSLError) as error:
            return 0, str(error)
        conn = http.client.HTTPSConnection(pod.ip, port, timeout=timeout, context=context)
        conn.sock = sock
        return netns_hosts.get_text(conn, path, headers)

    # After which line of its log a pod's probe must pass at once: its server listens (its gRPC
    # health answers SERVING from then on), and a router's GET /health answers 200 once a decode
    # worker joined it.
    READY_LINES = {"router": r" joined \(ROLE_DECODE"}

    def await_probe(self, pod, kind, limit_s=None):
        """Waits, on the pod's log, for the event after which its probe `kind` must pass: the
        server listening, or for a router's readiness a decode worker joined. Fails when the
        process exits first, or when the kubelet would have given up (initialDelaySeconds +
        periodSeconds x failureThreshold; at most `limit_s`). Then runs the probe once, as the
        kubelet would, and fails unless it passes."""
        spec = pod.container[kind]
        budget = (spec.get("initialDelaySeconds", 0) +
                  spec.get("periodSeconds", 10) * spec.get("failureThreshold", 3))
        budget = min(budget, limit_s) if limit_s else budget
        pod.process.wait_ready(budget)
        if kind == "readinessProbe" and pod.role in self.READY_LINES:
            pod.process.wait_line(self.READY_LINES[pod.role], budget)
        assert self.probe(pod, kind), f"{pod.name}: {kind} failed after its event:\n{pod.log(60)}"

    # -- lookups --------------------------------------------------------------------------------

    def endpoints(self, service_name):
        """The pods a Service selects."""
        service = next(s for s in by_kind(self.objects, "Service")
                       if s["metadata"]["name"] == service_name)
        return [p for p in self.pods if selects(service["spec"]["selector"], p.labels)]

    def of_role(self, role):
        return [p for p in self.pods if p.role == role]

    def logs(self, lines=30):
        return "\n".join(f"--- {p.name}\n{p.log(lines)}" for p in self.pods)
