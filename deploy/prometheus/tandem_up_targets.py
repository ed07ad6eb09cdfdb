#!/usr/bin/env python3
"""Prometheus file_sd targets for a local `tandem up` cluster, read from its output.

`tandem up` prints, once the cluster is ready,

    OpenAI HTTP API: http://127.0.0.1:8000/v1   (metrics: http://127.0.0.1:8000/metrics)
    ...
    workers:         prefill-0 127.0.0.1:33953 (metrics http://127.0.0.1:35635/metrics)
                     decode-0 127.0.0.1:41271 (metrics http://127.0.0.1:44839/metrics)

This writes one target per process, labelled as prometheus.yml labels pods on Kubernetes:
namespace (--namespace, default "local"), pool (router, prefill or decode) and pod (the process's
name in `tandem up`: router, prefill-0, decode-0, ...), so the rules and dashboards serve both.

    python3 tandem_up_targets.py up.log > targets/tandem-up.json     # or: ... < up.log
"""
import argparse
import json
import re
import sys

_ROUTER = re.compile(r"OpenAI HTTP API:\s+\S+\s+\(metrics: (?P<url>http://\S+?)\)")
_WORKER = re.compile(r"(?P<name>(?P<pool>prefill|decode)-\d+) \S+ \(metrics (?P<url>http://\S+?)\)")
_URL = re.compile(r"http://(?P<address>[^/\s]+)(?P<path>/\S*)")


class OutputError(ValueError):
    """The text is not the output of a `tandem up` cluster that became ready."""


def _target(url, labels):
    m = _URL.fullmatch(url)
    if m is None:
        raise OutputError(f"'{url}' is not a metrics URL (http://host:port/path)")
    address, path = m.group("address"), m.group("path")
    if address.rsplit(":", 1)[-1] in ("0", "-1"):
        raise OutputError(f"{labels['pod']} serves no metrics ({url}): it needs --metrics_listen")
    if path != "/metrics":
        labels = dict(labels, __metrics_path__=path)
    return {"targets": [address], "labels": labels}


def targets_from_output(text, namespace="local"):
    """The file_sd target groups (a list of {"targets": [...], "labels": {...}}) of the cluster
    whose `tandem up` output is `text`. Raises OutputError when the text has no ready cluster."""
    router = _ROUTER.search(text)
    if router is None:
        raise OutputError("no 'OpenAI HTTP API: ... (metrics: URL)' line: is this the output of "
                          "`tandem up` after it printed 'tandem cluster ready'?")
    groups = [_target(router.group("url"), {"namespace": namespace, "pool": "router",
                                            "pod": "router"})]
    seen = set()
    for m in _WORKER.finditer(text[router.end():]):
        if m.group("name") in seen:
            continue
        seen.add(m.group("name"))
        groups.append(_target(m.group("url"), {"namespace": namespace, "pool": m.group("pool"),
                                               "pod": m.group("name")}))
    if len(groups) == 1:
        raise OutputError("the output names no worker with a metrics URL (the 'workers:' lines)")
    return groups


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", nargs="?", help="a file with `tandem up`'s output (default stdin)")
    parser.add_argument("--namespace", default="local",
                        help="the namespace label of every target (default: local)")
    args = parser.parse_args(argv)
    if not args.namespace:
        parser.error("--namespace must not be empty")
    try:
        if args.output:
            with open(args.output, encoding="utf-8", errors="replace") as f:
                text = f.read()
        else:
            text = sys.stdin.read()
        groups = targets_from_output(text, args.namespace)
    except (OSError, OutputError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    json.dump(groups, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
