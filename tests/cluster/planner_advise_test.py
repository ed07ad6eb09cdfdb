"""The router's advisory planner (--planner=advise, router/server/planner_advisor.h) on a real
cluster: one prefill and one decode worker on loopback, requests through the official openai SDK,
then the router's /metrics carries a recommendation (waited for, not slept on): the recommended
configuration's info series, its workers by role, margin and headroom, the rate it planned for;
the INFO line it logged names the same configuration; and the exposition passes
`promtool check metrics`."""
import re
import shutil
import subprocess
import urllib.request

import openai
import pytest

from cluster_common import Cluster, Process, wait_until

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(prefill=1, decode=1, policy="slo", tag="plan",
                router_flags=["--planner=advise", "--planner_interval_s=0.2",
                              "--planner_max_workers=4", "--planner_max_simulations=60",
                              "--default_ttft_ms=5000", "--default_tpot_ms=500"])
    yield c
    c.stop()


def scrape(cluster):
    return urllib.request.urlopen(f"http://127.0.0.1:{cluster.http_port}/metrics",
                                  timeout=10).read().decode()


def value(text, name, labels=""):
    for line in text.splitlines():
        if line.startswith(name + labels + " ") or (not labels and line.startswith(name + " ")):
            return float(line.split()[-1])
    return None


def test_recommendation_after_traffic(cluster):
    # Before traffic: advices are skipped, and there is no recommendation.
    wait_until(lambda: value(scrape(cluster), "tandem_router_planner_runs_total",
                             '{outcome="skipped"}'), what="a skipped advice before traffic")
    assert "tandem_router_planner_recommended_info{" not in scrape(cluster)

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{cluster.http_port}/v1", api_key="unused",
                           max_retries=0)
    model = client.models.list().data[0].id
    for i in range(6):
        out = client.completions.create(model=model, prompt=f"Count to {i + 3}:", max_tokens=6,
                                        temperature=0)
        assert out.usage.completion_tokens >= 1

    def recommended():
        text = scrape(cluster)
        m = re.search(r'^tandem_router_planner_recommended_info\{label="([^"]+)"\} 1', text, re.M)
        return (m.group(1), text) if m else None

    label, text = wait_until(recommended, timeout=60, what="a recommendation in /metrics")
    planned = value(text, "tandem_router_planner_runs_total", '{outcome="planned"}') or 0
    infeasible = value(text, "tandem_router_planner_runs_total", '{outcome="infeasible"}') or 0
    assert planned + infeasible >= 1
    assert value(text, "tandem_router_planner_workload_requests_per_second") > 0
    # Six finished requests, each judged against the slo policy's default objectives.
    assert 0 <= value(text, "tandem_router_planner_observed_attainment_ratio") <= 1
    if label != "none":
        workers = {role: value(text, "tandem_router_planner_recommended_workers",
                               f'{{role="{role}"}}') for role in ("prefill", "decode", "both")}
        total = sum(workers.values())
        assert 1 <= total <= 4
        # The label says the same pools: "1P+2D slo" or "2x both slo".
        if workers["both"]:
            assert label.startswith(f"{workers['both']:.0f}x both slo")
        else:
            assert label.startswith(f"{workers['prefill']:.0f}P+{workers['decode']:.0f}D slo")
        assert value(text, "tandem_router_planner_recommended_cost") == total
        assert value(text, "tandem_router_planner_margin_ratio") >= 0
        assert value(text, "tandem_router_planner_rate_headroom_ratio") >= 1
    # One INFO line for the change, naming the same configuration.
    line = wait_until(lambda: next((l for l in cluster.router.log
                                    if "planner: recommends " in l), None),
                      what="the router's planner log line")
    print(line.strip())
    assert f"planner: recommends {label}" in line
    check = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True,
                           text=True)
    problems = [l for l in (check.stdout + check.stderr).splitlines()
                if "tandem_router_planner" in l]
    assert not problems, problems


def test_bad_planner_flag_is_refused():
    with pytest.raises(AssertionError, match="--planner must be off or advise, not 'auto'"):
        Process("tandem-router", "--listen=127.0.0.1:0", "--http_listen=127.0.0.1:0",
                "--workers=127.0.0.1:1", "--planner=auto")
