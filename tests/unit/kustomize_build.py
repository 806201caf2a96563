"""Enough of `kustomize build` to check deploy/k8s offline: the features that tree uses.

Anything else in a kustomization is refused, so a new feature cannot slip past the checks
unresolved. Generated ConfigMaps and Secrets keep their plain names here; kustomize adds a
content hash to them and to every reference, which changes no check.
"""

from __future__ import annotations

import base64
import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

Manifest = dict[str, Any]

KUSTOMIZATION_KEYS = frozenset(
    {
        "apiVersion",
        "kind",
        "namespace",
        "resources",
        "configMapGenerator",
        "secretGenerator",
        "patches",
    }
)
GENERATOR_KEYS = frozenset({"name", "files", "literals"})
PATCH_KEYS = frozenset({"path", "patch", "target"})
TARGET_KEYS = frozenset({"kind", "name", "labelSelector"})
CLUSTER_SCOPED_KINDS = frozenset(
    {
        "Namespace",
        "PersistentVolume",
        "StorageClass",
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "PriorityClass",
    }
)


class KustomizeError(ValueError):
    """A kustomization this resolver cannot build, or one kustomize itself would refuse."""


@dataclass
class Build:
    """The objects a kustomization produces and every file it read to produce them."""

    objects: list[Manifest] = field(default_factory=list)
    files: set[Path] = field(default_factory=set)
    generated: set[tuple[str, str]] = field(default_factory=set)  # (kind, name)

    def extend(self, other: Build) -> None:
        self.objects += other.objects
        self.files |= other.files
        self.generated |= other.generated

    def of_kind(self, kind: str) -> list[Manifest]:
        """The objects of one kind, in build order."""
        return [obj for obj in self.objects if obj["kind"] == kind]

    def named(self, kind: str, name: str) -> Manifest:
        """The one object of `kind` called `name` (AssertionError when absent)."""
        found = [obj for obj in self.of_kind(kind) if obj["metadata"]["name"] == name]
        assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
        return found[0]


def build(directory: Path) -> Build:
    """Resolve `directory/kustomization.yaml` like `kustomize build directory`."""
    path = directory / "kustomization.yaml"
    spec = yaml.safe_load(path.read_text(encoding="utf-8"))
    unknown = set(spec) - KUSTOMIZATION_KEYS
    if unknown:
        raise KustomizeError(f"{path}: unsupported keys {sorted(unknown)}")
    result = Build(files={path.resolve()})
    for entry in spec.get("resources", []):
        result.extend(_resource(directory, entry, path))
    for kind, key in (("ConfigMap", "configMapGenerator"), ("Secret", "secretGenerator")):
        for generator in spec.get(key, []):
            result.objects.append(_generate(directory, generator, kind, result.files))
            result.generated.add((kind, generator["name"]))
    for patch in spec.get("patches", []):
        result.objects = _apply_patch(directory, patch, result.objects, result.files)
    if "namespace" in spec:
        for obj in result.objects:
            if obj["kind"] not in CLUSTER_SCOPED_KINDS:
                obj["metadata"]["namespace"] = spec["namespace"]
    _refuse_duplicates(result.objects, path)
    return result


def load_manifests(path: Path) -> list[Manifest]:
    """The non-empty YAML documents of a file."""
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]


def _resource(directory: Path, entry: str, kustomization: Path) -> Build:
    target = (directory / entry).resolve()
    if target.is_dir():
        return build(target)
    if not target.is_file():
        raise KustomizeError(f"{kustomization}: resource {entry!r} does not exist")
    return Build(objects=load_manifests(target), files={target})


def _generate(directory: Path, generator: Manifest, kind: str, files: set[Path]) -> Manifest:
    """A ConfigMap or Secret from `files` (key = file name) and `literals` (key=value)."""
    unknown = set(generator) - GENERATOR_KEYS
    if unknown:
        raise KustomizeError(f"{kind} generator {generator.get('name')}: unsupported {unknown}")
    data: dict[str, str] = {}
    for entry in generator.get("files", []):
        key, _, name = entry.rpartition("=")
        path = (directory / name).resolve()
        if not path.is_file():
            raise KustomizeError(f"{kind} generator file {name!r} does not exist")
        files.add(path)
        data[key or path.name] = path.read_text(encoding="utf-8")
    for literal in generator.get("literals", []):
        key, sep, value = literal.partition("=")
        if not sep:
            raise KustomizeError(f"literal {literal!r} is not key=value")
        data[key] = value
    manifest: Manifest = {"apiVersion": "v1", "kind": kind, "metadata": {"name": generator["name"]}}
    if kind == "Secret":
        manifest["type"] = "Opaque"
        data = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    manifest["data"] = data
    return manifest


def _apply_patch(
    directory: Path, patch: Manifest, objects: list[Manifest], files: set[Path]
) -> list[Manifest]:
    unknown = set(patch) - PATCH_KEYS
    if unknown or ("path" in patch) == ("patch" in patch):
        raise KustomizeError(f"a patch needs exactly one of path/patch, got {sorted(patch)}")
    if "path" in patch:
        path = (directory / patch["path"]).resolve()
        if not path.is_file():
            raise KustomizeError(f"patch file {patch['path']!r} does not exist")
        files.add(path)
        text = path.read_text(encoding="utf-8")
    else:
        text = patch["patch"]
    body = yaml.safe_load(text)
    target = patch.get("target")
    if isinstance(body, list):
        if target is None:
            raise KustomizeError("a JSON 6902 patch needs a target")
        return [_json6902(obj, body) if _matches(obj, target) else obj for obj in objects]
    if body.get("$patch") != "delete":
        raise KustomizeError("only `$patch: delete` strategic-merge patches are supported")
    target = target or {"kind": body["kind"], "name": body["metadata"]["name"]}
    kept = [obj for obj in objects if not _matches(obj, target)]
    if len(kept) == len(objects):
        raise KustomizeError(f"delete patch matched nothing: {target}")
    return kept


def _matches(obj: Manifest, target: Manifest) -> bool:
    """Whether `obj` is selected by a patch target (kind, name regex, label equalities)."""
    unknown = set(target) - TARGET_KEYS
    if unknown:
        raise KustomizeError(f"unsupported patch target keys {sorted(unknown)}")
    if "kind" in target and obj["kind"] != target["kind"]:
        return False
    if "name" in target and not re.fullmatch(target["name"], obj["metadata"]["name"]):
        return False
    labels = obj["metadata"].get("labels", {})
    for requirement in filter(None, target.get("labelSelector", "").split(",")):
        key, sep, value = requirement.partition("=")
        if not sep or labels.get(key.strip()) != value.strip():
            return False
    return True


def _json6902(obj: Manifest, operations: list[Manifest]) -> Manifest:
    """`obj` with RFC 6902 add/replace/remove/test operations applied."""
    result = copy.deepcopy(obj)
    for operation in operations:
        *parents, last = [
            p.replace("~1", "/").replace("~0", "~") for p in operation["path"].split("/")[1:]
        ]
        node: Any = result
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        _json6902_step(node, last, operation)
    return result


def _json6902_step(node: Any, key: str, operation: Manifest) -> None:
    op = operation["op"]
    if isinstance(node, list):
        index = len(node) if key == "-" else int(key)
        if op == "add":
            node.insert(index, copy.deepcopy(operation["value"]))
            return
        if index >= len(node):
            raise KustomizeError(f"{op} {operation['path']}: no such element")
    elif op != "add" and key not in node:
        raise KustomizeError(f"{op} {operation['path']}: no such key")
    if op == "test":  # kustomize refuses the whole patch when a test fails
        found = node[index if isinstance(node, list) else key]
        if found != operation["value"]:
            raise KustomizeError(f"test {operation['path']}: {found!r} != {operation['value']!r}")
        return
    if op in ("add", "replace"):
        node[index if isinstance(node, list) else key] = copy.deepcopy(operation["value"])
    elif op == "remove":
        del node[index if isinstance(node, list) else key]
    else:
        raise KustomizeError(f"unsupported JSON 6902 operation {op!r}")


def _refuse_duplicates(objects: list[Manifest], path: Path) -> None:
    seen: set[tuple[str, str, str]] = set()
    for obj in objects:
        key = (obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if key in seen:
            raise KustomizeError(f"{path}: {key} is declared twice")
        seen.add(key)
