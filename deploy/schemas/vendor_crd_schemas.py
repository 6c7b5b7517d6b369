#!/usr/bin/env python3
"""Vendors the JSON schemas of the custom resources deploy/ uses, for tests/deploy (no network
in CI). Reads CustomResourceDefinition YAML files and writes one JSON schema per served version,
named <kind>-<group>-<version>.json (lower case), with the `description` texts removed (they are
most of the bytes) and `additionalProperties: false` added to every object that lists its
properties without allowing others, so a misspelt field is an error (what `kubectl apply
--validate=strict` reports) rather than silently pruned.

    python3 deploy/schemas/vendor_crd_schemas.py CRD.yaml... [--out deploy/schemas]

The CRDs come from the projects that define them (their Apache-2.0 `config/crd` folders):
  InferencePool  gateway-api-inference-extension  config/crd/bases/inference.networking.k8s.io_inferencepools.yaml
  HTTPRoute      gateway-api (standard channel)   config/crd/standard/gateway.networking.k8s.io_httproutes.yaml
Needs PyYAML.
"""

import argparse
import json
import pathlib
import sys

import yaml


def tighten(node):
    """Drops descriptions; closes objects that list their properties."""
    if isinstance(node, dict):
        node.pop("description", None)
        for value in node.values():
            tighten(value)
        if (
            node.get("type") == "object"
            and "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
    elif isinstance(node, list):
        for value in node:
            tighten(value)
    return node


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("crds", nargs="+", type=pathlib.Path)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path(__file__).parent)
    args = parser.parse_args()
    for path in args.crds:
        for crd in yaml.safe_load_all(path.read_text()):
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            spec = crd["spec"]
            group, kind = spec["group"], spec["names"]["kind"]
            for version in spec["versions"]:
                if not version.get("served", True):
                    continue
                schema = tighten(version["schema"]["openAPIV3Schema"])
                # apiVersion, kind and metadata are the API server's; allow them as Kubernetes does.
                schema.setdefault("properties", {}).update(
                    {
                        "apiVersion": {"type": "string", "enum": [f"{group}/{version['name']}"]},
                        "kind": {"type": "string", "enum": [kind]},
                        "metadata": {"type": "object"},
                    }
                )
                schema["required"] = sorted(set(schema.get("required", [])) | {"apiVersion", "kind"})
                name = f"{kind}-{group}-{version['name']}.json".lower()
                target = args.out / name
                target.write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
                print(f"wrote {target} ({target.stat().st_size} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
