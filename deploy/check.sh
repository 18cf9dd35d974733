#!/usr/bin/env bash
# Checks that the deployment files are well-formed with whatever tools the
# machine has: the Kubernetes manifests render with kustomize (kubectl
# kustomize, or kustomize), the balancer configurations parse with haproxy,
# the compose file is YAML with the expected services, the alerting rules
# pass promtool's check and unit tests, the dashboard is JSON. A missing tool
# is a note, not a failure (make test-replicas runs this; go test ./deploy
# checks the rules and the dashboard further, against a running server).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

if command -v kubectl >/dev/null; then
  kubectl kustomize "$here/kubernetes" >"$tmp/k8s.yaml"
elif command -v kustomize >/dev/null; then
  kustomize build "$here/kubernetes" >"$tmp/k8s.yaml"
else
  echo "deploy/check: no kubectl or kustomize: Kubernetes manifests not rendered" >&2
fi
if [ -s "$tmp/k8s.yaml" ]; then
  for kind in ConfigMap Service Deployment PodDisruptionBudget Job; do
    grep -q "^kind: $kind$" "$tmp/k8s.yaml" || { echo "deploy/check: rendered manifests lack a $kind" >&2; exit 1; }
  done
  echo "deploy/check: kubernetes manifests render ($(grep -c '^kind:' "$tmp/k8s.yaml") objects)"
fi

if command -v haproxy >/dev/null; then
  # The compose balancer resolves replicas by their service names, which
  # exist only inside compose's network: parse, do not resolve.
  sed 's/ resolvers docker init-addr last,libc,none/ init-addr none/' "$here/compose/haproxy.cfg" >"$tmp/haproxy.cfg"
  haproxy -c -q -f "$tmp/haproxy.cfg"
  echo "deploy/check: compose haproxy.cfg parses"
else
  echo "deploy/check: no haproxy: compose/haproxy.cfg not parsed" >&2
fi

if python3 -c 'import yaml' 2>/dev/null; then
  python3 - "$here/compose/compose.yaml" <<'PY'
import sys, yaml
d = yaml.safe_load(open(sys.argv[1]))
svc = d["services"]
want = {"postgres", "migrate", "sandbot-1", "sandbot-2", "sandbot-3", "haproxy"}
assert set(svc) == want, f"services {sorted(svc)}, want {sorted(want)}"
for n in ("sandbot-1", "sandbot-2", "sandbot-3"):
    s = svc[n]
    assert s["depends_on"]["migrate"]["condition"] == "service_completed_successfully", n
    assert "SANDBOT_DATABASE_URL" in s["environment"] and "SANDBOT_TRUSTED_PROXIES" in s["environment"], n
print("deploy/check: compose.yaml has postgres, migrate, 3 replicas and haproxy")
PY
else
  echo "deploy/check: no python3 yaml: compose.yaml not checked" >&2
fi

if command -v promtool >/dev/null; then
  (cd "$here/prometheus" && promtool check rules alerts.yml && promtool test rules alerts_test.yml)
  echo "deploy/check: prometheus/alerts.yml passes promtool check rules and test rules"
else
  echo "deploy/check: no promtool: prometheus/alerts.yml not checked" >&2
fi

if command -v python3 >/dev/null; then
  python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["panels"], "no panels"' "$here/grafana/sandbot.json"
  echo "deploy/check: grafana/sandbot.json is a dashboard"
fi
