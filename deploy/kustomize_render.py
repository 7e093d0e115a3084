#!/usr/bin/env python3
"""Render a simple kustomization without kustomize.

A stand-in for `kubectl kustomize DIR` on machines without kubectl (Debian's
only kubectl, package kubernetes-client, is 1.20 with an old embedded
kustomize, and is not in every release). It supports exactly the fields the
rifflefs kustomizations use and refuses any other field, so it can never
silently render something different from kustomize:

  resources  plain YAML files (no directories, no remote bases)
  namespace  set on every namespaced object (not on Namespace, CSIDriver and
             other cluster-scoped kinds)
  images     name -> newName / newTag / digest, in containers and
             initContainers of pod templates and pods

Usage: kustomize_render.py DIR > rendered.yaml
"""
import sys
from pathlib import Path

import yaml  # PyYAML, installed with kubernetes-validate

SUPPORTED = {"apiVersion", "kind", "resources", "namespace", "images"}
CLUSTER_SCOPED = {
    "Namespace", "CSIDriver", "StorageClass", "PersistentVolume",
    "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
    "PriorityClass", "VolumeAttachment", "CSINode",
}


def fail(msg):
    sys.exit(f"kustomize_render: {msg}")


def pod_specs(obj):
    kind = obj.get("kind")
    spec = obj.get("spec") or {}
    if kind == "Pod":
        yield spec
    elif kind == "CronJob":
        yield spec.get("jobTemplate", {}).get("spec", {}).get("template", {}).get("spec", {})
    elif "template" in spec:
        yield spec["template"].get("spec", {})


def set_image(container, images):
    image = container.get("image", "")
    name = image.split("@")[0]
    tag_sep = name.rfind(":")
    if tag_sep > name.rfind("/"):
        name = name[:tag_sep]
    for rule in images:
        if rule["name"] != name:
            continue
        new = rule.get("newName", name)
        if "digest" in rule:
            container["image"] = f"{new}@{rule['digest']}"
        elif "newTag" in rule:
            container["image"] = f"{new}:{rule['newTag']}"
        else:
            container["image"] = new + image[len(name):]


def render(directory):
    directory = Path(directory)
    kfile = directory / "kustomization.yaml"
    k = yaml.safe_load(kfile.read_text())
    unknown = set(k) - SUPPORTED
    if unknown:
        fail(f"{kfile}: unsupported fields {sorted(unknown)}; use kubectl kustomize")
    out = []
    for res in k.get("resources", []):
        path = directory / res
        if not path.is_file():
            fail(f"{kfile}: resource {res} is not a file")
        for obj in yaml.safe_load_all(path.read_text()):
            if obj is None:
                continue
            if "namespace" in k and obj.get("kind") not in CLUSTER_SCOPED:
                obj.setdefault("metadata", {})["namespace"] = k["namespace"]
            for spec in pod_specs(obj):
                for c in spec.get("containers", []) + spec.get("initContainers", []):
                    set_image(c, k.get("images", []))
            out.append(obj)
    return out


def main():
    if len(sys.argv) != 2:
        fail("usage: kustomize_render.py DIR")
    docs = render(sys.argv[1])
    sys.stdout.write(yaml.safe_dump_all(docs, sort_keys=True))


if __name__ == "__main__":
    main()
