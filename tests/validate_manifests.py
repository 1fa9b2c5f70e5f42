"""Strict validation of Kubernetes manifests (run by tests/tests/deploy.rs).

Usage: validate_manifests.py CRD_FILE VERSION[,VERSION...] FILE...

- Built-in kinds: kubernetes-validate (the official OpenAPI schemas) in
  strict mode (unknown fields rejected), for every VERSION.
- NodeAgent: the openAPIV3Schema of CRD_FILE, made strict (every object
  schema with properties and no x-kubernetes-preserve-unknown-fields gets
  additionalProperties: false, as the API server's strict field validation),
  and its (schemaless) pod template as a core/v1 PodTemplate.
- monitoring.coreos.com (ServiceMonitor, PodMonitor, PrometheusRule): the
  pydantic models generated from prometheus-operator's CRDs
  (cloudcoil-models-prometheus-operator); a field the model does not know is
  an error (found by comparing the document with the model's dump).

Prints one line per document and exits 1 on any failure.
"""

import sys

import jsonschema
import kubernetes_validate
import yaml
from cloudcoil.models.prometheus_operator import v1 as promop


def strict(schema):
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def unknown_fields(doc, dumped, path=""):
    """Keys of doc that the model's dump does not have."""
    out = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            if not isinstance(dumped, dict) or k not in dumped:
                out.append(f"{path}.{k}")
            else:
                out += unknown_fields(v, dumped[k], f"{path}.{k}")
    elif isinstance(doc, list) and isinstance(dumped, list):
        for i, (a, b) in enumerate(zip(doc, dumped)):
            out += unknown_fields(a, b, f"{path}[{i}]")
    return out


def main():
    crd_file, versions, files = sys.argv[1], sys.argv[2].split(","), sys.argv[3:]
    crd = yaml.safe_load(open(crd_file))
    schema = strict(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    # Every object has these, whatever its CRD's schema lists.
    schema["properties"].update({"apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"}})
    failed = 0
    for f in files:
        for doc in yaml.safe_load_all(open(f)):
            if not doc:
                continue
            what = f"{f}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
            group = doc.get("apiVersion", "").split("/")[0] if "/" in doc.get("apiVersion", "") else ""
            try:
                if doc.get("kind") == "NodeAgent":
                    jsonschema.validate(doc, schema)
                    # The pod template is schemaless in the CRD: validate it as a core/v1 PodTemplate.
                    pod_template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": doc["spec"]["template"]}
                    for v in versions:
                        kubernetes_validate.validate(pod_template, v, strict=True)
                    print(f"ok   {what} (CRD schema, strict; its pod template as core/v1 for {', '.join(versions)})")
                elif group == "monitoring.coreos.com":
                    model = getattr(promop, doc["kind"])
                    dumped = model.model_validate(doc).model_dump(by_alias=True, exclude_unset=True, mode="json")
                    extra = unknown_fields(doc, dumped)
                    if extra:
                        raise ValueError(f"unknown fields: {', '.join(extra)}")
                    print(f"ok   {what} (prometheus-operator models, strict)")
                else:
                    for v in versions:
                        kubernetes_validate.validate(doc, v, strict=True)
                    print(f"ok   {what} (Kubernetes {', '.join(versions)}, strict)")
            except Exception as e:  # noqa: BLE001 - every failure is reported
                failed += 1
                print(f"FAIL {what}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
