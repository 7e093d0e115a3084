#!/usr/bin/env bash
# Validates every Kubernetes manifest under deploy/ offline.
#
# 1. A Python venv with PyPI's kubernetes-validate (it ships the Kubernetes
#    JSON schemas; no cluster, no network beyond PyPI).
# 2. Renders deploy/kubernetes (the kustomize base) with `kubectl kustomize`
#    when kubectl is on PATH, and always with deploy/kustomize_render.py (a
#    small stand-in for machines without kubectl; Debian's kubectl is old or
#    absent). When both run, their outputs must be the same objects. The
#    rendered plugin (riffle-csi-node) and mounter (riffle-mounter)
#    DaemonSets must agree on the mounter's socket and the state dir, both
#    must tolerate every taint, and the mounter must keep OnDelete and no
#    memory limit unless it passes --fd-store to an fd store of the plugin's
#    pod (then a rolling update must start the new pod first), no
#    liveness probe, its root-disk check (no
#    --allow-root-disk-cache, --kubelet-dir where kubelet's dir is mounted).
#    The optional peers.yaml (headless Service) must select the mounter pods
#    under the name of its --peer-service, the daemons must listen on the pod
#    IP, the secret must be a file of an optional Secret volume, and the peer
#    port range must stay clear of the mounter's other ports.
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
K8S_VERSIONS=${K8S_VERSIONS:-"1.26.0 1.30.0 1.33.0"}
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
echo "== checking the plugin and mounter DaemonSets agree"
"$py" - "$rendered" <<'PY'
# The two DaemonSets only work together if they agree on paths; and the
# mounter's safety rests on a few settings a casual edit could undo.
import sys, yaml
objs = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(open(sys.argv[1])) if o}
errors = []
def ds(name):
    o = objs.get(("DaemonSet", name))
    if o is None:
        sys.exit(f"rendered base has no DaemonSet {name}")
    return o
def container(o, name):
    for c in o["spec"]["template"]["spec"]["containers"]:
        if c["name"] == name:
            return c
    sys.exit(f"DaemonSet {o['metadata']['name']} has no container {name}")
def flag(c, name):
    for a in c.get("args", []):
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
    return None
def mount_path(o, c, volume):
    vols = {v["name"]: v for v in o["spec"]["template"]["spec"]["volumes"]}
    for m in c.get("volumeMounts", []):
        if m["name"] == volume:
            return m["mountPath"], vols[volume].get("hostPath", {}).get("path"), m.get("mountPropagation")
    return None, None, None
plugin_ds, mounter_ds = ds("riffle-csi-node"), ds("riffle-mounter")
plugin, mounter = container(plugin_ds, "riffle-csi"), container(mounter_ds, "riffle-mounter")
if plugin.get("args", [None])[0] != "riffle-csi":
    errors.append("the plugin's first arg must be riffle-csi (the entrypoint's program)")
if mounter.get("args", [None])[0] != "riffle-mounter":
    errors.append("the mounter's first arg must be riffle-mounter (the entrypoint's program)")
sock_p, sock_m = flag(plugin, "mounter-socket"), flag(mounter, "socket")
if not sock_p or sock_p != sock_m:
    errors.append(f"plugin --mounter-socket={sock_p} but mounter --socket={sock_m}")
state = flag(plugin, "state-dir")
sp, sm = mount_path(plugin_ds, plugin, "state-dir"), mount_path(mounter_ds, mounter, "state-dir")
if sp[:2] != sm[:2] or sp[0] != state:
    errors.append(f"state dir differs: plugin --state-dir={state} mount {sp[:2]}, mounter mount {sm[:2]}")
if sock_m and state and not sock_m.startswith(state.rstrip("/") + "/"):
    errors.append(f"the mounter's socket {sock_m} is not in the shared state dir {state}")
secrets = flag(plugin, "secrets-dir")
xp, xm = mount_path(plugin_ds, plugin, "secrets-dir"), mount_path(mounter_ds, mounter, "secrets-dir")
if not secrets or xp[:2] != xm[:2] or xp[0] != secrets:
    errors.append(f"secrets dir differs: plugin --secrets-dir={secrets} mount {xp[:2]}, mounter mount {xm[:2]}")
if state and secrets and (secrets + "/").startswith(state.rstrip("/") + "/"):
    errors.append(f"--secrets-dir={secrets} is inside the state dir {state}, which is on disk")
if xp[2] != "Bidirectional" or xm[2] not in ("HostToContainer", "Bidirectional"):
    errors.append("the secrets dir must be mounted Bidirectional in the plugin (it may mount a tmpfs there) and HostToContainer in the mounter")
env = {e["name"]: e.get("value") for e in plugin.get("env", [])}
driver = objs.get(("CSIDriver", "riffle.csi.rifflefs.io"))
audiences = [t.get("audience") for t in (driver or {}).get("spec", {}).get("tokenRequests", [])]
audience = env.get("RIFFLE_CSI_TOKEN_AUDIENCE") or "sts.amazonaws.com"
if audience not in audiences:
    errors.append(f"the plugin's token audience {audience} is not in the CSIDriver's tokenRequests {audiences}")
if not (driver or {}).get("spec", {}).get("requiresRepublish"):
    errors.append("the CSIDriver needs requiresRepublish: true (fresh tokens and secrets)")
for o, c in ((plugin_ds, plugin), (mounter_ds, mounter)):
    if mount_path(o, c, "kubelet-dir")[2] != "Bidirectional":
        errors.append(f"{c['name']}: /var/lib/kubelet must be mounted Bidirectional")
if flag(plugin, "cache-dir") is not None:
    errors.append("--cache-dir is the mounter's option, not the plugin's")
strategy = mounter_ds["spec"].get("updateStrategy", {})
store_flag = flag(mounter, "fd-store")
if strategy.get("type") != "OnDelete":
    # A rolling update is safe only with the node's fd store holding the connections.
    if not store_flag:
        errors.append("the mounter must pass --fd-store, or be updated OnDelete (a restart ends its daemons)")
    if strategy.get("rollingUpdate", {}).get("maxUnavailable", 1) not in (0, "0", "0%"):
        errors.append("the mounter's rolling update must start the new pod first (maxSurge 1, maxUnavailable 0)")
if store_flag:
    stores = [c for c in plugin_ds["spec"]["template"]["spec"]["containers"]
              if c.get("args", [])[:2] == ["riffle", "fd-store"]]
    if not stores or f"--socket={store_flag}" not in stores[0].get("args", []):
        errors.append(f"the plugin's pod must run `riffle fd-store --socket={store_flag}` (the mounter's --fd-store)")
    elif mount_path(plugin_ds, stores[0], "state-dir")[0] != mount_path(mounter_ds, mounter, "state-dir")[0]:
        errors.append("the fd store and the mounter must see the state dir at the same path")
if "livenessProbe" in mounter:
    errors.append("the mounter must have no liveness probe (a restart ends its daemons)")
if "memory" in mounter.get("resources", {}).get("limits", {}) and not store_flag:
    errors.append("without --fd-store the mounter must have no memory limit (one OOM kill would end every daemon)")
for o in (plugin_ds, mounter_ds):
    tolerations = o["spec"]["template"]["spec"].get("tolerations", [])
    if {"operator": "Exists"} not in tolerations:
        errors.append(f"{o['metadata']['name']} must tolerate every taint (- operator: Exists), or nodes go without the driver")
kubelet_flag = flag(mounter, "kubelet-dir") or "/var/lib/kubelet"
if mount_path(mounter_ds, mounter, "kubelet-dir")[0] != kubelet_flag:
    errors.append(f"the mounter's --kubelet-dir ({kubelet_flag}) must be where kubelet's directory is mounted (the root-disk check compares with it)")
if "--allow-root-disk-cache" in mounter.get("args", []):
    errors.append("--allow-root-disk-cache must not be the default: a cache on the root disk gets pods evicted")
if errors:
    sys.exit("\n".join(errors))
print("   riffle-csi-node and riffle-mounter agree (socket, state dir, secrets dir, propagation, tolerations, token audience, root-disk check)")
PY

echo "== checking the optional peers component (peers.yaml) against the mounter"
"$py" - "$rendered" "$here/kubernetes/peers.yaml" "$here/kubernetes/kustomization.yaml" <<'PY'
# Peers only work if the mounter's flags, its pod and the headless Service agree:
# the Service must list the mounter pods, under the name the daemons resolve; the
# daemons must listen on the address the Service lists (the pod IP); the secret
# must come from an optional Secret volume as a file (never an argument); the port
# range must stay clear of the mounter's other port and of the node's NodePort and
# ephemeral ranges (host network).
import sys, yaml
objs = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(open(sys.argv[1])) if o}
peers = [o for o in yaml.safe_load_all(open(sys.argv[2])) if o]
base = yaml.safe_load(open(sys.argv[3]))
errors = []
ds = objs[("DaemonSet", "riffle-mounter")]
pod = ds["spec"]["template"]["spec"]
c = [c for c in pod["containers"] if c["name"] == "riffle-mounter"][0]
def flag(name):
    for a in c.get("args", []):
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
    return None
if "peers.yaml" in base.get("resources", []):
    errors.append("peers.yaml is optional (like podmonitor.yaml): keep it out of the base's resources")
services = [o for o in peers if o["kind"] == "Service"]
if len(services) != 1:
    errors.append(f"peers.yaml must hold one Service, not {len(services)}")
else:
    svc = services[0]
    spec = svc["spec"]
    if spec.get("clusterIP") != "None":
        errors.append("the peers Service must be headless (clusterIP: None): one DNS address per mounter pod")
    if spec.get("publishNotReadyAddresses"):
        errors.append("the peers Service must list only ready mounter pods")
    labels = ds["spec"]["template"]["metadata"]["labels"]
    selector = spec.get("selector") or {}
    if not selector or any(labels.get(k) != v for k, v in selector.items()):
        errors.append(f"the peers Service's selector {selector} does not select the mounter pods {labels}")
    if svc["metadata"].get("namespace") != ds["metadata"].get("namespace"):
        errors.append("the peers Service must be in the mounter's namespace")
    service_flag = flag("peer-service")
    name = svc["metadata"]["name"]
    if service_flag is None:
        errors.append("the mounter must pass --peer-service (the peers Service's name)")
    elif service_flag.split(".")[0] != name or (
        "." in service_flag and service_flag.split(".")[1] != svc["metadata"].get("namespace")
    ):
        errors.append(f"--peer-service={service_flag} does not name the Service {name}")
if flag("peer-service") is not None:
    if not pod.get("hostNetwork"):
        errors.append("peers expect the mounter on the host network (the Service's addresses are the nodes')")
    env = {e["name"]: e for e in c.get("env", [])}
    address = env.get("RIFFLE_PEER_ADDRESS", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    if address != "status.podIP" and flag("peer-address") is None:
        errors.append("RIFFLE_PEER_ADDRESS must come from status.podIP (the address the Service lists)")
    secret_file = flag("peer-secret-file") or "/etc/riffle-peers/secret"
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    mounts = [m for m in c.get("volumeMounts", []) if secret_file.startswith(m["mountPath"].rstrip("/") + "/")]
    if not mounts:
        errors.append(f"--peer-secret-file={secret_file} is on no volume of the mounter")
    else:
        v = vols.get(mounts[0]["name"], {})
        if "secret" not in v:
            errors.append(f"--peer-secret-file={secret_file} must come from a Secret volume")
        elif not v["secret"].get("optional"):
            errors.append("the peer Secret volume must be optional (no Secret: no peers, the mounter still runs)")
        if not mounts[0].get("readOnly"):
            errors.append("the peer Secret must be mounted readOnly")
    if any("secret=" in a.lower() and not a.startswith("--peer-secret-file=") for a in c.get("args", [])):
        errors.append("a secret value in the mounter's args")
    ports = flag("peer-ports") or "7000-7999"
    first, _, last = ports.partition("-")
    first, last = int(first), int(last or first)
    if not 1024 <= first <= last < 30000:
        errors.append(f"--peer-ports={ports} must be within 1024-29999 (clear of NodePorts and ephemeral ports)")
    others = [p["containerPort"] for p in c.get("ports", [])]
    metrics = flag("metrics-addr")
    if metrics:
        others.append(int(metrics.rsplit(":", 1)[1]))
    if any(first <= p <= last for p in others):
        errors.append(f"--peer-ports={ports} overlaps the mounter's other ports {others}")
if errors:
    sys.exit("\n".join(errors))
print("   peers.yaml and riffle-mounter agree (headless Service over the mounter pods, --peer-service, pod IP, optional Secret file, port range)")
PY

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
