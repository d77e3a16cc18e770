"""Renders our Kustomize tree without the kustomize binary (not installable everywhere tests run).

It implements only what deploy/k8s uses — ``resources``, ``components``, ``namespace``,
``labels``, ``images`` (``newTag``), ``configMapGenerator`` (``files``) and JSON 6902
``patches`` with a ``target`` (ops add, replace, remove, test) — and fails on any other key, so
a manifest that relies on more cannot pass unnoticed. The output is what the validators check;
``kubectl kustomize`` renders the same objects (names of generated ConfigMaps aside, which real
Kustomize suffixes with a content hash).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

__all__ = ["render"]

_KNOWN = {
    "apiVersion",
    "kind",
    "resources",
    "components",
    "namespace",
    "labels",
    "images",
    "configMapGenerator",
    "patches",
}


def _pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]


def _apply_op(doc: Any, op: dict[str, Any]) -> None:
    *parents, last = _pointer(op["path"])
    node = doc
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    kind = op["op"]
    if isinstance(node, list):
        index = len(node) if last == "-" else int(last)
        if kind == "add":
            node.insert(index, op["value"])
        elif kind == "replace":
            node[index] = op["value"]
        elif kind == "remove":
            del node[index]
        elif kind == "test":
            assert node[index] == op["value"], f"patch test failed at {op['path']}"
        else:
            raise ValueError(f"unsupported op {kind}")
        return
    if kind in ("add", "replace"):
        if kind == "replace" and last not in node:
            raise KeyError(f"replace of a missing path {op['path']}")
        node[last] = op["value"]
    elif kind == "remove":
        del node[last]
    elif kind == "test":
        assert node[last] == op["value"], f"patch test failed at {op['path']}"
    else:
        raise ValueError(f"unsupported op {kind}")


def _patch(docs: list[dict[str, Any]], patch: dict[str, Any]) -> None:
    target = patch["target"]
    ops = yaml.safe_load(patch["patch"])
    hits = [
        d for d in docs if d["kind"] == target["kind"] and d["metadata"]["name"] == target["name"]
    ]
    assert hits, f"patch target {target} matches nothing"
    for doc in hits:
        for op in ops:
            _apply_op(doc, op)


def _labels(doc: dict[str, Any], pairs: dict[str, str]) -> None:
    doc["metadata"].setdefault("labels", {}).update(pairs)


def _resources(folder: Path, spec: dict[str, Any]) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for resource in spec.get("resources", []):
        path = folder / resource
        if path.is_dir():
            docs.extend(render(path))
        else:
            text = path.read_text(encoding="utf-8")
            docs.extend(d for d in yaml.safe_load_all(text) if d)
    for generator in spec.get("configMapGenerator", []):
        data = {}
        for entry in generator["files"]:
            key, _, name = entry.partition("=")
            data[key] = (folder / (name or key)).read_text(encoding="utf-8")
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": generator["name"]},
                "data": data,
            }
        )
    return docs


def _patches(folder: Path, spec: dict[str, Any]) -> list[dict[str, Any]]:
    patches: list[dict[str, Any]] = []
    for component in spec.get("components", []):
        comp = yaml.safe_load(
            (folder / component / "kustomization.yaml").read_text(encoding="utf-8")
        )
        assert comp["kind"] == "Component"
        assert set(comp) <= {"apiVersion", "kind", "patches"}
        patches.extend(comp.get("patches", []))
    patches.extend(spec.get("patches", []))
    return patches


def _images(docs: list[dict[str, Any]], images: list[dict[str, str]]) -> None:
    for image in images:
        for doc in docs:
            for container in _containers(doc):
                name = container["image"].partition(":")[0]
                if name == image["name"]:
                    container["image"] = f"{name}:{image['newTag']}"


def render(folder: Path) -> list[dict[str, Any]]:
    spec = yaml.safe_load((folder / "kustomization.yaml").read_text(encoding="utf-8"))
    unknown = set(spec) - _KNOWN
    assert not unknown, f"{folder}: keys this renderer does not implement: {unknown}"
    docs = _resources(folder, spec)
    for patch in _patches(folder, spec):
        _patch(docs, patch)
    for entry in spec.get("labels", []):
        for doc in docs:
            _labels(doc, entry["pairs"])
    _images(docs, spec.get("images", []))
    if "namespace" in spec:
        for doc in docs:
            if doc["kind"] != "Namespace":
                doc["metadata"]["namespace"] = spec["namespace"]
    return copy.deepcopy(docs)


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    template = doc.get("spec", {}).get("template", {}).get("spec", {})
    return list(template.get("containers", []))
