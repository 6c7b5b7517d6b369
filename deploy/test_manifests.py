"""Validates deploy/'s Kubernetes manifests without a cluster (run by deploy/check.sh, in CI).

- Built-in kinds against the Kubernetes API schemas that the PyPI package kubernetes-validate
  ships (strict: unknown fields are errors), for KUBERNETES_VERSION.
- InferencePool and HTTPRoute against the schemas vendored in deploy/schemas (made from the
  projects' CRDs by deploy/schemas/vendor_crd_schemas.py; CEL rules are not checked).
- The pieces agree: selectors match pod labels, ports and probe targets exist, the grace period
  covers ferry's shutdown_timeout, the metric names the HPA and the Endpoint Picker read are ones
  ferry exports (crates/ferry-metrics/src/lib.rs), each kustomization lists exactly its folder's manifests.
- The validators can fail: broken copies of the manifests are rejected.
"""

import copy
import json
import pathlib
import re
import tomllib
import unittest

import jsonschema
import kubernetes_validate
import yaml

KUBERNETES_VERSION = "1.33"
DEPLOY = pathlib.Path(__file__).resolve().parent
ROOT = DEPLOY.parent
FOLDERS = ["kubernetes", "inference-gateway"]
CUSTOM_KINDS = {
    ("inference.networking.k8s.io/v1", "InferencePool"): "inferencepool-inference.networking.k8s.io-v1.json",
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "httproute-gateway.networking.k8s.io-v1.json",
}


def load_folder(folder):
    docs = []
    for path in sorted((DEPLOY / folder).glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs.append((path.name, doc))
    return docs


ALL = [doc for folder in FOLDERS for doc in load_folder(folder)]


def validate(doc):
    """Raises on an invalid manifest."""
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in CUSTOM_KINDS:
        schema = json.loads((DEPLOY / "schemas" / CUSTOM_KINDS[key]).read_text())
        jsonschema.Draft202012Validator(schema).validate(doc)
    else:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def one(kind, name=None):
    found = [d for _, d in ALL if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def exported_metric_names():
    """The metric names ferry exports, from crates/ferry-metrics/src/lib.rs's tables (the `ferry_...` and alias
    names in backticks, labels and suffixes as documented)."""
    text = (ROOT / "crates" / "ferry-metrics" / "src" / "lib.rs").read_text()
    names = set(re.findall(r"`((?:ferry_|vllm:)[a-z_:]+)", text))
    assert "ferry_requests_waiting" in names and "vllm:kv_cache_usage_perc" in names, names
    return names


def ferry_container():
    pod = one("Deployment", "ferry")["spec"]["template"]["spec"]
    return pod, next(c for c in pod["containers"] if c["name"] == "ferry")


def duration_seconds(text):
    match = re.fullmatch(r"(\d+)(ms|s|m|h)", text.strip())
    assert match, text
    value, unit = int(match[1]), match[2]
    return value * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]


class Schemas(unittest.TestCase):
    def test_every_manifest_is_valid(self):
        self.assertGreaterEqual(len(ALL), 10)
        for name, doc in ALL:
            with self.subTest(file=name, kind=doc["kind"], name=doc["metadata"]["name"]):
                validate(doc)

    def test_broken_manifests_are_rejected(self):
        deployment = one("Deployment", "ferry")
        broken = []
        misspelt = copy.deepcopy(deployment)
        misspelt["spec"]["replica"] = misspelt["spec"].pop("replicas")
        broken.append(misspelt)
        wrong_type = copy.deepcopy(deployment)
        wrong_type["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "45s"
        broken.append(wrong_type)
        pool = copy.deepcopy(one("InferencePool"))
        pool["spec"]["targetPort"] = pool["spec"].pop("targetPorts")
        broken.append(pool)
        route = copy.deepcopy(one("HTTPRoute"))
        route["spec"]["rules"][0]["backendRefs"][0]["weight"] = "heavy"
        broken.append(route)
        for doc in broken:
            with self.subTest(kind=doc["kind"]):
                with self.assertRaises(
                    (kubernetes_validate.ValidationError, jsonschema.ValidationError)
                ) as caught:
                    validate(doc)
                print(f"  rejected {doc['kind']}: {str(caught.exception).splitlines()[0][:120]}")

    def test_kustomizations_list_exactly_their_folder(self):
        for folder in FOLDERS:
            kustomization = yaml.safe_load((DEPLOY / folder / "kustomization.yaml").read_text())
            files = {p.name for p in (DEPLOY / folder).glob("*.yaml")} - {"kustomization.yaml"}
            self.assertEqual(set(kustomization["resources"]), files, folder)


class Consistency(unittest.TestCase):
    def test_service_and_pool_select_the_ferry_pods_on_their_port(self):
        pod, ferry = ferry_container()
        labels = one("Deployment", "ferry")["spec"]["template"]["metadata"]["labels"]
        ports = {p["name"]: p["containerPort"] for p in ferry["ports"]}
        service = one("Service", "ferry")
        self.assertLessEqual(service["spec"]["selector"].items(), labels.items())
        for port in service["spec"]["ports"]:
            self.assertIn(port["targetPort"], ports)
        pool = one("InferencePool")
        self.assertLessEqual(pool["spec"]["selector"]["matchLabels"].items(), labels.items())
        self.assertEqual([p["number"] for p in pool["spec"]["targetPorts"]], [ports["http"]])
        config = tomllib.loads((ROOT / "config" / "default.toml").read_text())
        self.assertEqual(ports["http"], config["server"]["port"])

    def test_probes_gpu_and_graceful_termination(self):
        pod, ferry = ferry_container()
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            self.assertEqual(ferry[probe]["httpGet"], {"path": "/health", "port": "http"}, probe)
        resources = ferry["resources"]
        self.assertEqual(resources["requests"]["nvidia.com/gpu"], resources["limits"]["nvidia.com/gpu"])
        # The image serves docker/Dockerfile's config: config/default.toml with two lines changed.
        config = tomllib.loads((ROOT / "config" / "default.toml").read_text())
        shutdown = duration_seconds(config["server"]["shutdown_timeout"])
        pre_stop = float(ferry["lifecycle"]["preStop"]["exec"]["command"][-1])
        self.assertGreaterEqual(pod["terminationGracePeriodSeconds"], pre_stop + shutdown + 5)
        epp_pod = one("Deployment", "ferry-epp")["spec"]["template"]["spec"]
        self.assertGreaterEqual(epp_pod["terminationGracePeriodSeconds"], pod["terminationGracePeriodSeconds"])

    def test_models_volume_is_filled_before_ferry_reads_it(self):
        pod, ferry = ferry_container()
        env = {e["name"]: e.get("value") for e in ferry["env"]}
        init = pod["initContainers"][0]
        init_env = {e["name"]: e.get("value") for e in init["env"]}
        self.assertEqual(env["FERRY_MODEL"], "/models/" + init_env["MODEL_FILE"])
        mounts = {m["name"]: m["mountPath"] for m in ferry["volumeMounts"]}
        init_mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
        self.assertEqual(mounts["models"], init_mounts["models"])
        claim = next(v for v in pod["volumes"] if v["name"] == "models")["persistentVolumeClaim"]["claimName"]
        one("PersistentVolumeClaim", claim)

    def test_autoscaler_and_picker_read_metrics_ferry_exports(self):
        names = exported_metric_names()
        hpa = one("HorizontalPodAutoscaler", "ferry")
        self.assertEqual(hpa["spec"]["scaleTargetRef"]["name"], "ferry")
        for metric in hpa["spec"]["metrics"]:
            self.assertIn(metric["pods"]["metric"]["name"], names)
        picker = yaml.safe_load(one("ConfigMap", "ferry-epp")["data"]["ferry-plugins.yaml"])
        self.assertEqual(picker["kind"], "EndpointPickerConfig")
        extractor = next(p for p in picker["plugins"] if p["type"] == "core-metrics-extractor")
        engines = {e["name"]: e for e in extractor["parameters"]["engineConfigs"]}
        labels = one("Deployment", "ferry")["spec"]["template"]["metadata"]["labels"]
        self.assertIn(labels[extractor["parameters"]["engineLabelKey"]], engines)
        for engine in engines.values():
            for field in ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec"):
                self.assertIn(engine[field], names, f"{engine['name']}.{field}")
        self.assertIn(extractor["parameters"]["defaultEngine"], engines)

    def test_routes_reach_the_pool_and_the_pool_its_picker(self):
        pool = one("InferencePool")
        route = one("HTTPRoute")
        refs = [b for rule in route["spec"]["rules"] for b in rule["backendRefs"]]
        self.assertEqual({(b["kind"], b["name"]) for b in refs}, {("InferencePool", pool["metadata"]["name"])})
        picker_ref = pool["spec"]["endpointPickerRef"]
        service = one("Service", picker_ref["name"])
        self.assertIn(picker_ref["port"]["number"], [p["port"] for p in service["spec"]["ports"]])
        epp = one("Deployment", picker_ref["name"])
        args = epp["spec"]["template"]["spec"]["containers"][0]["args"]
        self.assertEqual(args[args.index("--pool-name") + 1], pool["metadata"]["name"])
        config_file = args[args.index("--config-file") + 1]
        self.assertIn(pathlib.Path(config_file).name, one("ConfigMap", "ferry-epp")["data"])


if __name__ == "__main__":
    unittest.main()
