#!/usr/bin/env python3
"""Renders the hami-agent chart with Helm's own engine and validates every manifest.

Helm: the `helm-python-sdk` package (PyPI) binds Helm's Go SDK (v4) through a C ABI; it
renders and lints exactly as `helm template` / `helm lint` do, without the `helm` binary
(which no registry reachable from CI ships). Kubernetes schemas: `kubernetes-validate`
(PyPI). The two prometheus-operator kinds (ServiceMonitor, PrometheusRule) have no schema
there; their fields are checked here, and the rules themselves by `promtool`.

usage: check_chart.py CHART_DIR OUT_DIR [VALUES_JSON...]
Writes every rendered manifest of every value set to OUT_DIR; exits 1 on the first failure.
"""
import json
import os
import sys

import helm_python as helm
import kubernetes_validate
import yaml

K8S_VERSION = "1.30.0"


def fail(msg):
    print(f"check_chart: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def check_crd_kinds(doc, name):
    kind = doc["kind"]
    spec = doc.get("spec") or {}
    if kind == "ServiceMonitor":
        eps = spec.get("endpoints") or fail(f"{name}: ServiceMonitor without endpoints")
        for ep in eps:
            for k in ep:
                if k not in {"port", "path", "interval", "honorLabels", "relabelings", "scheme"}:
                    fail(f"{name}: unknown ServiceMonitor endpoint field {k}")
            if not isinstance(ep.get("honorLabels"), bool):
                fail(f"{name}: honorLabels must be a boolean")
        if "matchLabels" not in spec.get("selector", {}):
            fail(f"{name}: ServiceMonitor without selector.matchLabels")
    elif kind == "PrometheusRule":
        groups = spec.get("groups") or fail(f"{name}: PrometheusRule without groups")
        for g in groups:
            for r in g["rules"]:
                if bool(r.get("alert")) == bool(r.get("record")) or not r.get("expr"):
                    fail(f"{name}: rule without one of alert/record, or without expr: {r}")
                if r.get("alert") and not (r.get("annotations") or {}).get("runbook_url"):
                    fail(f"{name}: alert {r['alert']} without a runbook_url")
    else:
        return False
    return True


def main():
    chart, out = sys.argv[1], sys.argv[2]
    value_sets = [json.loads(v) for v in sys.argv[3:]] or [{}]
    os.makedirs(out, exist_ok=True)
    lint = helm.lint(chart)
    print(f"check_chart: helm lint: {json.dumps(lint, default=str)}")
    # Helm's severities: 1 info, 2 warning, 4 error.
    bad = [m for m in lint.get("messages", []) if m.get("severity", 0) >= 4]
    if lint.get("errors") or bad:
        fail(f"helm lint: {lint}")
    count = 0
    kinds = set()
    with helm.Chart.load(chart) as c:
        for i, values in enumerate(value_sets):
            manifests = c.render(values, name="hami", namespace="hami-system")
            for path, body in sorted(manifests.items()):
                if not path.endswith(".yaml") or not body.strip():
                    continue
                fname = f"{i}-" + path.replace("/", "_")
                with open(os.path.join(out, fname), "w") as f:
                    f.write(body)
                for doc in yaml.safe_load_all(body):
                    if not doc:
                        continue
                    name = f"{fname}:{doc.get('kind')}"
                    kinds.add(doc["kind"])
                    if not check_crd_kinds(doc, name):
                        try:
                            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
                        except kubernetes_validate.ValidationError as e:
                            fail(f"{name}: {e.message} at {list(e.path)}")
                    count += 1
    print(f"check_chart: {count} manifests valid ({', '.join(sorted(kinds))}); Kubernetes {K8S_VERSION} schemas")


if __name__ == "__main__":
    main()
