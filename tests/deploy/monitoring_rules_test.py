"""The Prometheus configuration of deploy/prometheus: `promtool check config`, `promtool check
rules` and the rules' unit tests (`promtool test rules`), that every alert is annotated and unit
tested both firing and silent, that the unit tests fail when an alert loses its `for:` or its
threshold moves, that the rules read only metrics docs/metrics.md lists, and the targets file
that tandem_up_targets.py writes from `tandem up`'s output."""
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import yaml

ROOT = pathlib.Path(os.environ.get("TANDEM_SOURCE_DIR") or pathlib.Path(__file__).parents[2])
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
RULE_FILES = sorted((PROMETHEUS_DIR / "rules").glob("*.yml"))
UNIT_TESTS = PROMETHEUS_DIR / "tests" / "tandem-rules.test.yml"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
sys.path.insert(0, str(PROMETHEUS_DIR))
import tandem_up_targets  # noqa: E402

# Debian's Prometheus is built without Kubernetes service discovery; its promtool refuses the
# kubernetes_sd_configs block with exactly this.
NO_KUBERNETES_SD = "field kubernetes_sd_configs not found"


@pytest.fixture(scope="module", autouse=True)
def need_promtool():
    if not os.access(PROMTOOL, os.X_OK):
        pytest.fail("no promtool: scripts/setup.sh installs Debian's prometheus")


def promtool(*args, cwd=None):
    return subprocess.run([PROMTOOL, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          timeout=60)


def rules(kind):
    """Every recording rule (kind "record") or alert ("alert") of the rule files."""
    out = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            out += [r for r in group["rules"] if kind in r]
    return out


def test_rule_files_pass_promtool_check():
    p = promtool("check", "rules", *RULE_FILES)
    assert p.returncode == 0, p.stdout + p.stderr
    total = len(rules("record")) + len(rules("alert"))
    found = sum(int(n) for n in re.findall(r"SUCCESS: (\d+) rules found", p.stdout))
    assert found == total >= 40, p.stdout


def test_local_config_passes_promtool_check():
    p = promtool("check", "config", PROMETHEUS_DIR / "prometheus-local.yml")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SUCCESS: 2 rule files found" in p.stdout, p.stdout


def test_kubernetes_config_passes_promtool_check(tmp_path):
    config = PROMETHEUS_DIR / "prometheus.yml"
    p = promtool("check", "config", config)
    if p.returncode != 0 and NO_KUBERNETES_SD in p.stdout + p.stderr:
        # This promtool cannot parse Kubernetes discovery: check everything else (relabelling,
        # rule files) with the discovery swapped for a file, beside the rules it names.
        data = yaml.safe_load(config.read_text())
        jobs = data["scrape_configs"]
        assert [j["job_name"] for j in jobs] == ["tandem", "tandem-tls-router",
                                                 "tandem-tls-workers"]
        for job in jobs:
            assert job.pop("kubernetes_sd_configs") == [{"role": "pod"}]
            job["file_sd_configs"] = [{"files": [str(tmp_path / "pods.json")]}]
        (tmp_path / "pods.json").write_text("[]")
        shutil.copytree(PROMETHEUS_DIR / "rules", tmp_path / "rules")
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(data))
        p = promtool("check", "config", tmp_path / "prometheus.yml")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SUCCESS: 2 rule files found" in p.stdout, p.stdout


def test_rule_unit_tests_pass():
    p = promtool("test", "rules", UNIT_TESTS.name, cwd=UNIT_TESTS.parent)
    assert p.returncode == 0 and "SUCCESS" in p.stdout, p.stdout + p.stderr


def test_every_alert_is_annotated_and_unit_tested_firing_and_silent():
    tests = yaml.safe_load(UNIT_TESTS.read_text())["tests"]
    fired, silent = set(), set()
    for t in tests:
        for case in t.get("alert_rule_test", []):
            (fired if case["exp_alerts"] else silent).add(case["alertname"])
    alerts = rules("alert")
    assert len(alerts) >= 8
    for a in alerts:
        name = a["alert"]
        assert a["labels"]["severity"] in ("warning", "critical"), name
        assert a["annotations"]["summary"] and a["annotations"]["description"], name
        assert re.fullmatch(r"\d+m", a["for"]) and int(a["for"][:-1]) >= 1, name
        assert name in fired, f"{name} is never shown firing in {UNIT_TESTS.name}"
        assert name in silent, f"{name} is never shown silent in {UNIT_TESTS.name}"


def mutated_rules(tmp_path, name, change):
    """A copy of deploy/prometheus with alert `name` changed by change(rule)."""
    copy = tmp_path / name
    shutil.copytree(PROMETHEUS_DIR, copy, ignore=shutil.ignore_patterns("*.py", "targets"))
    path = copy / "rules" / "tandem-alerts.yml"
    data = yaml.safe_load(path.read_text())
    [rule] = [r for g in data["groups"] for r in g["rules"] if r.get("alert") == name]
    change(rule)
    path.write_text(yaml.safe_dump(data))
    return copy / "tests"


@pytest.mark.parametrize("name", [a["alert"] for a in rules("alert")])
def test_unit_tests_fail_when_an_alert_fires_at_once_or_never(tmp_path, name):
    """The unit tests hold each alert to its `for:` (it must not fire before) and to its
    condition (it must fire): without `for:`, or with a condition that never holds, they fail."""
    at_once = mutated_rules(tmp_path, name, lambda r: r.pop("for"))
    p = promtool("test", "rules", UNIT_TESTS.name, cwd=at_once)
    assert p.returncode != 0 and name in p.stdout + p.stderr, p.stdout
    never = mutated_rules(tmp_path / "never", name,
                          lambda r: r.update(expr=f"({r['expr'].strip()}) and on () vector(0) < 0"))
    p = promtool("test", "rules", UNIT_TESTS.name, cwd=never)
    assert p.returncode != 0 and name in p.stdout + p.stderr, p.stdout


def test_rules_read_only_documented_metrics():
    """Every tandem_* metric the rules read is one that docs/metrics.md lists (with a histogram's
    _bucket, _sum and _count)."""
    documented = set(re.findall(r"`(tandem_[a-z_]+)`", (ROOT / "docs" / "metrics.md").read_text()))
    read = set()
    for r in rules("record") + rules("alert"):
        raw = re.sub(r"[A-Za-z_]\w*:[\w:]*", "", r["expr"])  # without recorded series (a:b:c)
        read |= set(re.findall(r"\b(tandem_[a-z_]+)\b", raw))
    unknown = {m for m in read if re.sub(r"_(bucket|sum|count)$", "", m) not in documented}
    assert read and not unknown, unknown


UP_OUTPUT = """\
[prefill-0] tandem-prefill prefill-0 listening on port 33953 (model m, metrics port 35635)
tandem cluster ready: 1 prefill + 2 decode worker(s), policy kv_aware
  OpenAI HTTP API: http://127.0.0.1:8000/v1   (metrics: http://127.0.0.1:8000/metrics)
  gRPC API:        127.0.0.1:7000 (tandem.v1.Inference)
  workers:         prefill-0 127.0.0.1:33953 (metrics http://127.0.0.1:35635/metrics)
                   decode-0 127.0.0.1:41271 (metrics http://127.0.0.1:44839/metrics)
                   decode-1 127.0.0.1:41272 (metrics http://127.0.0.1:44840/metrics)
"""


def test_targets_from_tandem_up_output(tmp_path):
    (tmp_path / "up.log").write_text(UP_OUTPUT)
    p = subprocess.run([sys.executable, str(PROMETHEUS_DIR / "tandem_up_targets.py"),
                        str(tmp_path / "up.log"), "--namespace=dev"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == [
        {"targets": ["127.0.0.1:8000"], "labels": {"namespace": "dev", "pool": "router",
                                                    "pod": "router"}},
        {"targets": ["127.0.0.1:35635"], "labels": {"namespace": "dev", "pool": "prefill",
                                                     "pod": "prefill-0"}},
        {"targets": ["127.0.0.1:44839"], "labels": {"namespace": "dev", "pool": "decode",
                                                     "pod": "decode-0"}},
        {"targets": ["127.0.0.1:44840"], "labels": {"namespace": "dev", "pool": "decode",
                                                     "pod": "decode-1"}},
    ]


@pytest.mark.parametrize("text,message", [
    ("[router] starting\n", "no 'OpenAI HTTP API"),
    (UP_OUTPUT.split("  workers:")[0], "names no worker"),
    (UP_OUTPUT.replace("44839", "0"), "decode-0 serves no metrics"),
])
def test_targets_refuse_output_without_a_ready_cluster(text, message):
    with pytest.raises(tandem_up_targets.OutputError, match=message):
        tandem_up_targets.targets_from_output(text)
    p = subprocess.run([sys.executable, str(PROMETHEUS_DIR / "tandem_up_targets.py")],
                       input=text, capture_output=True, text=True, timeout=30)
    assert p.returncode == 1 and p.stdout == "" and message in p.stderr, p.stderr
