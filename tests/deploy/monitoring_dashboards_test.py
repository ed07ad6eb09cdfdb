"""The Grafana dashboards and provisioning files of deploy/grafana, checked without Grafana: each
dashboard's JSON is well formed and up to date with deploy/grafana/dashboards.py, its panels have
unique ids and titles, sit on the grid without overlapping and each has a query; every variable a
query refers to is defined (before the variables that use it); every query parses as PromQL
(through `promtool check rules`) and reads only series that exist: documented metrics, the
recording rules' series, or `up`."""
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
GRAFANA_DIR = ROOT / "deploy" / "grafana"
sys.path.insert(0, str(GRAFANA_DIR))
import dashboards  # noqa: E402
import render_panels  # noqa: E402

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
DASHBOARD_FILES = sorted((GRAFANA_DIR / "dashboards").glob("*.json"))
BUILTINS = {"__rate_interval", "__interval", "__interval_ms", "__range", "__range_s"}
# Values standing for the variables when a query is parsed.
SAMPLE_VALUES = {"datasource": "prometheus", "namespace": "ns", "pool": "(prefill|decode)",
                 "worker": "(decode-0|decode-1)"}


def load(path):
    return json.loads(path.read_text(encoding="utf-8"))


def test_the_five_dashboards_exist_and_are_up_to_date():
    assert [p.name for p in DASHBOARD_FILES] == sorted(dashboards.all_dashboards())
    assert len(DASHBOARD_FILES) == 5
    p = subprocess.run([sys.executable, str(GRAFANA_DIR / "dashboards.py"), "--check"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    boards = [load(p) for p in DASHBOARD_FILES]
    assert len({b["uid"] for b in boards}) == len({b["title"] for b in boards}) == 5
    assert {b["uid"] for b in boards} == set(render_panels.MAIN_PANELS)


def test_check_reports_a_stale_dashboard(tmp_path):
    shutil.copytree(GRAFANA_DIR / "dashboards", tmp_path / "d")
    path = tmp_path / "d" / "tandem-overview.json"
    path.write_text(path.read_text().replace("Goodput", "Goodbye"))
    p = subprocess.run([sys.executable, str(GRAFANA_DIR / "dashboards.py"), "--check",
                        "--out", str(tmp_path / "d")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "tandem-overview.json" in p.stderr, p.stderr


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_panels_have_unique_ids_a_place_and_a_query(path):
    board = load(path)
    panels = list(render_panels.panels_of(board))
    assert len(panels) >= 8
    ids = [p["id"] for p in panels]
    assert len(set(ids)) == len(ids), ids
    titles = [p["title"] for p in panels]
    assert len(set(titles)) == len(titles), titles
    cells = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        covered = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                   for y in range(g["y"], g["y"] + g["h"])}
        assert not covered & cells, f"{p['title']} overlaps another panel"
        cells |= covered
        assert p["targets"], f"{p['title']} has no query"
        for t in p["targets"]:
            assert t["expr"].strip() and t["refId"], p["title"]
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"]), p["title"]
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["description"], p["title"]


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_every_variable_used_is_defined_before_use(path):
    board = load(path)
    variables = board["templating"]["list"]
    names = [v["name"] for v in variables]
    assert {"datasource", "namespace", "pool", "worker"} <= set(names), names
    defined = set(BUILTINS)
    for v in variables:
        query = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        used = render_panels.referenced_variables(query)
        assert used <= defined, f"variable {v['name']} uses {used - defined} before definition"
        if v["type"] == "query":
            assert v["datasource"]["uid"] == "${datasource}", v["name"]
        defined.add(v["name"])
    for p in render_panels.panels_of(board):
        texts = [t["expr"] for t in p["targets"]] + [p["datasource"]["uid"]]
        for text in texts:
            used = render_panels.referenced_variables(text)
            assert used <= defined, f"{p['title']} uses undefined {used - defined}: {text}"


def recorded_series():
    names = set()
    for path in (ROOT / "deploy" / "prometheus" / "rules").glob("*.yml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            names |= {r["record"] for r in group["rules"] if "record" in r}
    return names


def test_every_query_parses_and_reads_series_that_exist(tmp_path):
    if not os.access(PROMTOOL, os.X_OK):
        pytest.fail("no promtool: scripts/setup.sh installs Debian's prometheus")
    documented = set(re.findall(r"`(tandem_[a-z_]+)`", (ROOT / "docs" / "metrics.md").read_text()))
    recorded = recorded_series()
    rules, unknown = [], []
    for path in DASHBOARD_FILES:
        board = load(path)
        for v in board["templating"]["list"]:
            if v["type"] == "query":
                m = re.match(r"label_values\((.*),\s*\w+\)$", v["query"]["query"])
                assert m, v["query"]
                rules.append(render_panels.substitute(m.group(1), SAMPLE_VALUES))
        for p, _, expr in render_panels.panel_queries(board, SAMPLE_VALUES):
            rules.append(expr)
            names = set(re.findall(r"[A-Za-z_][\w:]*(?=\s*[{\[])|[A-Za-z_]\w*:[\w:]+", expr))
            for name in names - {"by", "on", "sum", "max", "min", "count", "rate"}:
                base = re.sub(r"_(bucket|sum|count)$", "", name)
                if name != "up" and name not in recorded and base not in documented:
                    unknown.append(f"{path.stem} / {p['title']}: {name}")
    assert not unknown, unknown
    # promtool parses every expression of a rule file: one recording rule per query.
    file = tmp_path / "queries.yml"
    file.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": [
        {"record": f"query_{i}", "expr": e} for i, e in enumerate(rules)]}]}))
    p = subprocess.run([PROMTOOL, "check", "rules", str(file)], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"SUCCESS: {len(rules)} rules found" in p.stdout
    assert len(rules) >= 60


def test_worker_selector_matches_worker_ids_with_and_without_a_port():
    """The router labels its per-worker gauges with worker ids: `tandem up` names them after the
    process (decode-0), a worker left to name itself uses <host name>:<port> (on Kubernetes, the
    pod's name and port)."""
    [pattern] = re.findall(r'worker=~"([^"]+)"', dashboards.ROUTER_WORKER)
    regex = render_panels.substitute(pattern, {"worker": "(decode-0|decode-1)", "namespace": "x"})
    for worker_id in ("decode-0", "decode-1:7100"):
        assert re.fullmatch(regex, worker_id), (regex, worker_id)
    for worker_id in ("decode-10", "prefill-0:7100", "decode-0:"):
        assert not re.fullmatch(regex, worker_id), (regex, worker_id)


def test_substitute_refuses_an_undefined_variable():
    with pytest.raises(KeyError, match=r"\$nope"):
        render_panels.substitute('up{pod=~"$nope"}', SAMPLE_VALUES)
    assert render_panels.substitute('rate(x{a="${pool}"}[$__rate_interval])', SAMPLE_VALUES) == \
        'rate(x{a="(prefill|decode)"}[1m])'


def test_provisioning_files():
    [source] = yaml.safe_load((GRAFANA_DIR / "provisioning" / "datasources" / "tandem.yml")
                              .read_text())["datasources"]
    assert source["type"] == "prometheus" and source["isDefault"] and source["url"]
    provisioning = yaml.safe_load((GRAFANA_DIR / "provisioning" / "dashboards" / "tandem.yml")
                                  .read_text())
    assert provisioning["apiVersion"] == 1
    [provider] = provisioning["providers"]
    assert provider["type"] == "file" and provider["options"]["path"]
