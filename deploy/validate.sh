#!/usr/bin/env bash
# Validates every Kubernetes manifest under deploy/ offline.
#
# 1. A Python venv with PyPI's kubernetes-validate (it ships the Kubernetes
#    JSON schemas; no cluster, no network beyond PyPI).
# 2. Renders deploy/kubernetes (the kustomize base) with `kubectl kustomize`
#    when kubectl is on PATH, and always with deploy/kustomize_render.py (a
#    small stand-in for machines without kubectl; Debian's kubectl is old or
#    absent). When both run, their outputs must be the same objects.
# 3. Validates, in strict mode (unknown fields are errors), the rendered
#    base and every manifest in deploy/kubernetes and deploy/examples,
#    against each Kubernetes version in $K8S_VERSIONS.
# 4. Checks the non-Kubernetes examples: the systemd unit with
#    systemd-analyze when available, the fstab line's field count.
#
# Usage: deploy/validate.sh            (VENV=dir to reuse a venv)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
VENV=${VENV:-${TMPDIR:-/tmp}/riffle-validate-venv}
K8S_VERSIONS=${K8S_VERSIONS:-"1.30.0 1.33.0"}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ ! -x "$VENV/bin/kubernetes-validate" ]; then
    echo "== creating venv $VENV with kubernetes-validate"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check 'kubernetes-validate>=1.30'
fi
py="$VENV/bin/python"

echo "== rendering deploy/kubernetes"
"$py" "$here/kustomize_render.py" "$here/kubernetes" > "$work/rendered-python.yaml"
rendered="$work/rendered-python.yaml"
if command -v kubectl >/dev/null 2>&1; then
    kubectl kustomize "$here/kubernetes" > "$work/rendered-kubectl.yaml"
    "$py" - "$work/rendered-kubectl.yaml" "$work/rendered-python.yaml" <<'PY'
import sys, yaml
def load(p):
    return sorted((yaml.safe_load_all(open(p))), key=lambda o: (o["kind"], o["metadata"]["name"]))
a, b = load(sys.argv[1]), load(sys.argv[2])
if a != b:
    sys.exit("kubectl kustomize and kustomize_render.py disagree")
print(f"   kubectl kustomize and kustomize_render.py agree ({len(a)} objects)")
PY
    rendered="$work/rendered-kubectl.yaml"
else
    echo "   kubectl not found: using kustomize_render.py only"
fi
grep -q 'kind: DaemonSet' "$rendered" || { echo "rendered base has no DaemonSet" >&2; exit 1; }

manifests=("$rendered")
while IFS= read -r f; do
    manifests+=("$f")
done < <(find "$here/kubernetes" "$here/examples" -name '*.yaml' ! -name kustomization.yaml | sort)

status=0
for v in $K8S_VERSIONS; do
    echo "== kubernetes-validate --strict -k $v (${#manifests[@]} files)"
    if ! "$VENV/bin/kubernetes-validate" --strict --quiet -k "$v" "${manifests[@]}"; then
        status=1
    fi
done

echo "== non-Kubernetes examples"
unit="$here/examples/riffle-dataset.service"
if command -v systemd-analyze >/dev/null 2>&1; then
    # `verify` also wants the binaries to exist; only report syntax problems.
    if systemd-analyze verify "$unit" 2>&1 | grep -v -e 'not executable' -e 'No such file' -e 'Command .* is not' | grep -q .; then
        systemd-analyze verify "$unit" || status=1
    fi
else
    grep -q '^ExecStart=/usr/local/bin/riffle mount ' "$unit" || { echo "bad unit $unit" >&2; status=1; }
fi
bad=$(grep -v -e '^#' -e '^[[:space:]]*$' "$here/examples/fstab" | awk 'NF != 6' | wc -l)
[ "$bad" -eq 0 ] || { echo "fstab: a line without 6 fields" >&2; status=1; }

if [ "$status" -eq 0 ]; then
    echo "all manifests valid"
else
    echo "validation FAILED" >&2
fi
exit "$status"
