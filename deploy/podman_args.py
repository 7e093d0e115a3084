#!/usr/bin/env python3
"""Translate one container of a Kubernetes pod template into `podman create` arguments.

What kubelet and the container runtime would do with a container of a DaemonSet, Job or
Pod, done by podman on one machine: csi/tests/containers.rs runs the node's DaemonSets
(deploy/kubernetes/daemonset.yaml, mounter.yaml) and a training pod
(deploy/examples/static-pv-training-job.yaml) this way, so the test runs what the manifests
say and cannot drift from them. Like kustomize_render.py it knows exactly the fields those
manifests use and refuses any other, so a new field fails the test until it is translated
(or listed as kubelet's business below).

Translated:
  container  image (through --image OLD=NEW, or *=NEW for any; never pulled), command (the entrypoint), args,
             $(VAR) references in them, env (value; fieldRef spec.nodeName, status.podIP,
             status.hostIP, metadata.name, metadata.namespace), volumeMounts (mountPath,
             readOnly, mountPropagation: Bidirectional = rshared, HostToContainer = rslave,
             None = rprivate), resources.limits (memory, cpu), securityContext (privileged,
             allowPrivilegeEscalation, readOnlyRootFilesystem, runAsUser, runAsGroup,
             capabilities, seccompProfile; none: the runtime's default seccomp profile, as
             kubelet with seccompDefault)
  pod        hostNetwork, securityContext (runAsUser, runAsGroup, fsGroup),
             terminationGracePeriodSeconds (the stop timeout), volumes: hostPath (under
             --node-root, except /dev: the node's devices are this machine's; its type is
             checked or created as kubelet does), secret (only optional ones, which kubelet
             mounts empty when the Secret is absent: there is no API server), emptyDir, and
             any volume given by --volume-source NAME=PATH (a PVC's or CSI volume's publish
             target, which kubelet binds into the container)
Kubelet's business, listed in "ignored" (the caller plays it): scheduling (nodeSelector,
tolerations, priorityClassName, serviceAccountName, automountServiceAccountToken, dnsPolicy,
resources.requests, extended resources), probes, ports, restartPolicy and imagePullPolicy.

Usage: podman_args.py FILE KIND/NAME CONTAINER --node-root DIR [--node-name N] [--node-ip IP]
           [--pod-uid UID] [--image OLD=NEW]... [--volume-source NAME=PATH]...
Prints JSON: {"options": [...], "entrypoint": [...] or null, "image": "...", "args": [...],
"ignored": [...]}; run `podman create OPTIONS [--entrypoint JSON] IMAGE ARGS...`.
"""
import argparse
import json
import os
import re
import stat
import sys

import yaml  # PyYAML

PROPAGATION = {"Bidirectional": "rshared", "HostToContainer": "rslave", "None": "rprivate"}
SCHEDULING = {
    "nodeSelector", "tolerations", "priorityClassName", "serviceAccountName",
    "automountServiceAccountToken", "dnsPolicy", "affinity", "restartPolicy",
}
POD_FIELDS = SCHEDULING | {
    "containers", "volumes", "hostNetwork", "securityContext", "terminationGracePeriodSeconds",
}
CONTAINER_FIELDS = {
    "name", "image", "imagePullPolicy", "command", "args", "env", "ports", "livenessProbe",
    "readinessProbe", "startupProbe", "resources", "securityContext", "volumeMounts",
}
PROBES = ("livenessProbe", "readinessProbe", "startupProbe")


def fail(msg):
    sys.exit(f"podman_args: {msg}")


def check_fields(obj, allowed, where):
    unknown = set(obj) - allowed
    if unknown:
        fail(f"{where}: fields {sorted(unknown)} are not translated; add them to podman_args.py")


def pod_template(path, kind, name):
    with open(path) as f:
        for obj in yaml.safe_load_all(f):
            if obj and obj.get("kind") == kind and obj["metadata"]["name"] == name:
                if kind == "Pod":
                    return obj["spec"]
                return obj["spec"]["template"]["spec"]
    fail(f"{path}: no {kind} {name}")


def quantity(q):
    """A Kubernetes quantity in bytes (memory) or as a number (cpu)."""
    s = str(q)
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6,
             "G": 10**9, "T": 10**12, "m": 10**-3}
    m = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", s)
    if not m or (m.group(2) and m.group(2) not in units):
        fail(f"cannot read the quantity {s!r}")
    return float(m.group(1)) * units.get(m.group(2), 1)


def expand(text, env):
    """Kubernetes' $(VAR) expansion: defined names are replaced, $$ escapes, others stay."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)),
                  text)


def host_path(volume, node_root, where):
    """The host path of a hostPath volume, checked or created as its type says."""
    path = volume["path"]
    kind = volume.get("type", "")
    host = path if path == "/dev" or path.startswith("/dev/") else os.path.join(
        node_root, path.lstrip("/"))
    checks = {
        "Directory": stat.S_ISDIR, "File": stat.S_ISREG, "Socket": stat.S_ISSOCK,
        "CharDevice": stat.S_ISCHR, "BlockDevice": stat.S_ISBLK,
    }
    if kind == "DirectoryOrCreate":
        os.makedirs(host, mode=0o755, exist_ok=True)
    elif kind == "FileOrCreate":
        os.makedirs(os.path.dirname(host), exist_ok=True)
        open(host, "a").close()
    elif kind in checks:
        try:
            ok = checks[kind](os.stat(host).st_mode)
        except FileNotFoundError:
            ok = False
        if not ok:
            fail(f"{where}: hostPath type check failed: {host} is not a {kind}")
    elif kind:
        fail(f"{where}: hostPath type {kind} is not translated")
    return host


def translate(spec, container_name, opts):
    ignored = []
    check_fields(spec, POD_FIELDS, "pod spec")
    ignored += [f"pod.{k}" for k in sorted(SCHEDULING & set(spec))]
    containers = {c["name"]: c for c in spec["containers"]}
    if container_name not in containers:
        fail(f"no container {container_name} (there are {sorted(containers)})")
    c = containers[container_name]
    check_fields(c, CONTAINER_FIELDS, f"container {container_name}")
    images = dict(i.split("=", 1) for i in opts.image)
    image = images.get(c["image"], images.get("*"))
    if image is None:
        fail(f"container {container_name}: image {c['image']} has no --image {c['image']}=LOCAL")
    options = ["--pull=never"]
    ignored += [f"{k} (kubelet's)" for k in PROBES + ("ports", "imagePullPolicy") if k in c]

    host_network = spec.get("hostNetwork", False)
    if host_network:
        options.append("--network=host")
    pod_ip = opts.node_ip if host_network else None
    fields = {
        "spec.nodeName": opts.node_name, "status.hostIP": opts.node_ip, "status.podIP": pod_ip,
        "metadata.name": opts.pod_name, "metadata.namespace": opts.namespace,
    }
    env = {}
    for e in c.get("env", []):
        check_fields(e, {"name", "value", "valueFrom"}, f"env {e['name']}")
        if "valueFrom" in e:
            ref = e["valueFrom"].get("fieldRef", {}).get("fieldPath")
            if set(e["valueFrom"]) != {"fieldRef"} or fields.get(ref) is None:
                fail(f"env {e['name']}: valueFrom {e['valueFrom']} is not translated")
            env[e["name"]] = fields[ref]
        else:
            env[e["name"]] = expand(str(e.get("value", "")), env)
    for k, v in env.items():
        options.append(f"--env={k}={v}")

    pod_sc = spec.get("securityContext", {})
    check_fields(pod_sc, {"runAsUser", "runAsGroup", "fsGroup"}, "pod securityContext")
    sc = c.get("securityContext", {})
    check_fields(sc, {"privileged", "allowPrivilegeEscalation", "readOnlyRootFilesystem",
                      "runAsUser", "runAsGroup", "capabilities", "seccompProfile"},
                 f"container {container_name} securityContext")
    if sc.get("privileged"):
        options.append("--privileged")
    if sc.get("allowPrivilegeEscalation") is False:
        options.append("--security-opt=no-new-privileges")
    if sc.get("readOnlyRootFilesystem"):
        options.append("--read-only")
    for cap in sc.get("capabilities", {}).get("add", []):
        options.append(f"--cap-add={cap}")
    for cap in sc.get("capabilities", {}).get("drop", []):
        options.append(f"--cap-drop={cap}")
    seccomp = sc.get("seccompProfile", {}).get("type", "RuntimeDefault")
    if seccomp == "Unconfined":
        options.append("--security-opt=seccomp=unconfined")
    elif seccomp != "RuntimeDefault":
        fail(f"seccompProfile {seccomp} is not translated")
    user = sc.get("runAsUser", pod_sc.get("runAsUser"))
    group = sc.get("runAsGroup", pod_sc.get("runAsGroup"))
    if user is not None:
        options.append(f"--user={user}" + (f":{group}" if group is not None else ""))
    if "fsGroup" in pod_sc:
        options.append(f"--group-add={pod_sc['fsGroup']}")

    resources = c.get("resources", {})
    check_fields(resources, {"requests", "limits"}, f"container {container_name} resources")
    if "requests" in resources:
        ignored.append("resources.requests (scheduling)")
    for k, v in resources.get("limits", {}).items():
        if k == "memory":
            limit = int(quantity(v))
            # No swap, as kubelet runs containers.
            options += [f"--memory={limit}", f"--memory-swap={limit}"]
        elif k == "cpu":
            options.append(f"--cpus={quantity(v):g}")
        else:
            ignored.append(f"resources.limits.{k} (an extended resource)")
    if "terminationGracePeriodSeconds" in spec:
        options.append(f"--stop-timeout={spec['terminationGracePeriodSeconds']}")

    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    sources = dict(s.split("=", 1) for s in opts.volume_source)
    pod_dir = os.path.join(opts.node_root, "var/lib/kubelet/pods", opts.pod_uid, "volumes")
    for m in c.get("volumeMounts", []):
        check_fields(m, {"name", "mountPath", "readOnly", "mountPropagation"},
                     f"volumeMount {m['name']}")
        v = volumes.get(m["name"])
        if v is None:
            fail(f"volumeMount {m['name']}: no such volume")
        where = f"volume {m['name']}"
        if m["name"] in sources:
            host = sources[m["name"]]
        elif "hostPath" in v:
            host = host_path(v["hostPath"], opts.node_root, where)
        elif "secret" in v:
            if not v["secret"].get("optional"):
                fail(f"{where}: a Secret that is not optional needs an API server")
            host = os.path.join(pod_dir, "kubernetes.io~secret", m["name"])
            os.makedirs(host, exist_ok=True)
            ignored.append(f"{where}: optional Secret {v['secret']['secretName']} absent, empty")
        elif "emptyDir" in v:
            host = os.path.join(pod_dir, "kubernetes.io~empty-dir", m["name"])
            os.makedirs(host, exist_ok=True)
        else:
            fail(f"{where}: {sorted(set(v) - {'name'})} is not translated; give --volume-source")
        flags = ["ro" if m.get("readOnly") else "rw",
                 PROPAGATION[m.get("mountPropagation", "None")]]
        options.append(f"--volume={host}:{m['mountPath']}:{','.join(flags)}")

    entrypoint = [expand(a, env) for a in c["command"]] if "command" in c else None
    args = [expand(a, env) for a in c.get("args", [])]
    return {"options": options, "entrypoint": entrypoint, "image": image,
            "args": args, "ignored": ignored}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("file")
    p.add_argument("workload", help="KIND/NAME, e.g. DaemonSet/riffle-mounter")
    p.add_argument("container")
    p.add_argument("--node-root", required=True)
    p.add_argument("--node-name", default="node")
    p.add_argument("--node-ip", default="127.0.0.1")
    p.add_argument("--pod-name", default="pod")
    p.add_argument("--namespace", default="default")
    p.add_argument("--pod-uid", default="pod")
    p.add_argument("--image", action="append", default=[])
    p.add_argument("--volume-source", action="append", default=[])
    opts = p.parse_args()
    kind, _, name = opts.workload.partition("/")
    spec = pod_template(opts.file, kind, name)
    json.dump(translate(spec, opts.container, opts), sys.stdout)
    print()


if __name__ == "__main__":
    main()
