"""prometheus-operator's CRDs for the kinds deploy/ uses, for a real API server
(run by tests/tests/real_cluster.rs).

Usage: operator_crds.py > crds.json

No registry ships prometheus-operator's CRD manifests; PyPI ships the
pydantic models generated from them (cloudcoil-models-prometheus-operator,
whose version is the operator's). This writes, for ServiceMonitor,
PodMonitor and PrometheusRule, a CustomResourceDefinition whose
openAPIV3Schema is the model's JSON schema made structural, as the API server
requires: every $ref inlined, `X | None` as X, a literal as an enum, int or
string as x-kubernetes-int-or-string, titles and defaults dropped, metadata
left to the server. The output is one JSON List of the three CRDs.
"""

import json
import sys

from cloudcoil.models.prometheus_operator import v1 as promop

KINDS = [("ServiceMonitor", "servicemonitors"), ("PodMonitor", "podmonitors"), ("PrometheusRule", "prometheusrules")]


def structural(node, defs, depth=0):
    if depth > 64:
        raise ValueError("schema nested beyond 64 levels (a cycle?)")
    if "$ref" in node:
        return structural(defs[node["$ref"].split("/")[-1]], defs, depth + 1)
    if "anyOf" in node:
        options = [defs[o["$ref"].split("/")[-1]] if "$ref" in o else o for o in node["anyOf"]]
        options = [o for o in options if o.get("type") != "null"]
        types = sorted(o.get("type", "") for o in options)
        if types == ["integer", "string"]:
            return {"x-kubernetes-int-or-string": True}
        if len(options) != 1:
            raise ValueError(f"anyOf with {len(options)} non-null options: {node}")
        return structural(options[0], defs, depth + 1)
    out = {}
    if "const" in node:
        out["enum"] = [node["const"]]
    for key in ("type", "enum", "format", "description", "minimum", "maximum", "minLength", "maxLength", "pattern", "minItems", "maxItems"):
        if key in node and key not in out:
            out[key] = node[key]
    if "properties" in node:
        out["type"] = "object"
        out["properties"] = {k: structural(v, defs, depth + 1) for k, v in node["properties"].items()}
        if node.get("required"):
            out["required"] = node["required"]
    if isinstance(node.get("additionalProperties"), dict):
        out["type"] = "object"
        out["additionalProperties"] = structural(node["additionalProperties"], defs, depth + 1)
    elif node.get("type") == "object" and "properties" not in node:
        out["x-kubernetes-preserve-unknown-fields"] = True
    if "items" in node:
        out["items"] = structural(node["items"], defs, depth + 1)
    if "type" not in out and "x-kubernetes-int-or-string" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def crd(kind, plural):
    schema = getattr(promop, kind).model_json_schema(by_alias=True)
    defs = schema.get("$defs", {})
    props = {k: v for k, v in schema["properties"].items() if k not in ("apiVersion", "kind", "metadata")}
    root = structural({"type": "object", "properties": props, "required": [r for r in schema.get("required", []) if r in props]}, defs)
    root["properties"].update({"apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"}})
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com",
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower()},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": root}}],
        },
    }


def main():
    items = [crd(kind, plural) for kind, plural in KINDS]
    json.dump({"apiVersion": "v1", "kind": "List", "items": items}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
