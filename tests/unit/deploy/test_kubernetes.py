"""Invariants of every rendered Kubernetes overlay (kubectl kustomize + PyYAML)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from tests.unit.deploy.k8s_render import (
    K8S,
    NAMESPACES,
    OVERLAYS,
    containers,
    find,
    pod_specs,
)

CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
SECRETISH = re.compile(r"TOKEN|PASSWORD|SECRET|DATABASE_URL|PASSWD|API_KEY", re.I)
Docs = dict[str, list[dict[str, Any]]]


def _all_containers(docs: list[dict[str, Any]]):  # type: ignore[no-untyped-def]
    for doc in docs:
        for where, pod in pod_specs(doc):
            for is_init, c in containers(pod):
                yield f"{where}/{c['name']}", is_init, c


def image_is_pinned(image: str) -> bool:
    if "@sha256:" in image:
        return True
    name, _, tag = image.rpartition(":")
    return bool(name) and "/" not in tag and tag not in ("", "latest")


@pytest.mark.parametrize("image,ok", [
    ("python:3.11.14-slim", True), ("reg:5000/a/b:1.2", True), ("a/b@sha256:" + "0" * 64, True),
    ("a/b", False), ("a/b:latest", False), ("reg:5000/a/b", False)])
def test_image_pin_rule(image: str, ok: bool) -> None:
    assert image_is_pinned(image) is ok


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_has_the_overlay_namespace(rendered: Docs, overlay: str) -> None:
    for doc in rendered[overlay]:
        ns = doc["metadata"].get("namespace")
        if doc["kind"] in CLUSTER_SCOPED:
            assert ns is None, doc["metadata"]["name"]
        else:
            assert ns == NAMESPACES[overlay], f"{doc['kind']}/{doc['metadata']['name']}: {ns}"
    assert find(rendered[overlay], "Namespace")["metadata"]["name"] == NAMESPACES[overlay]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_images_pinned_probes_and_resources_everywhere(rendered: Docs, overlay: str) -> None:
    seen = 0
    for where, is_init, c in _all_containers(rendered[overlay]):
        seen += 1
        assert image_is_pinned(c["image"]), f"{where}: image {c['image']} is not pinned"
        res = c.get("resources", {})
        for part in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(res.get(part, {})), f"{where}: {part} cpu/memory"
        if not is_init:  # Kubernetes allows no probes on init containers
            assert "readinessProbe" in c and "livenessProbe" in c, f"{where}: probes"
    assert seen >= 4  # control plane, ray head, gpu worker + its init container (+ postgres)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_are_restricted_non_root(rendered: Docs, overlay: str) -> None:
    for doc in rendered[overlay]:
        for where, pod in pod_specs(doc):
            sc = pod.get("securityContext", {})
            assert sc.get("runAsNonRoot") is True and sc.get("runAsUser", 0) != 0, where
            assert sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", where
            assert pod.get("automountServiceAccountToken") is False, where
            assert not pod.get("hostNetwork") and not pod.get("hostPID"), where
            for _, c in containers(pod):
                csc = c.get("securityContext", {})
                assert csc.get("allowPrivilegeEscalation") is False, f"{where}/{c['name']}"
                assert csc.get("capabilities", {}).get("drop") == ["ALL"], f"{where}/{c['name']}"
                assert not csc.get("privileged"), f"{where}/{c['name']}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_secret_value_in_plain_text(rendered: Docs, overlay: str) -> None:
    docs = rendered[overlay]
    secret_names = {d["metadata"]["name"] for d in docs if d["kind"] == "Secret"}
    secret_names |= {d["spec"]["target"]["name"] for d in docs if d["kind"] == "ExternalSecret"}
    refs = 0
    for where, _, c in _all_containers(docs):
        for env in c.get("env", []):
            if SECRETISH.search(env["name"]):
                assert "value" not in env, f"{where}: {env['name']} set in plain text"
                ref = env["valueFrom"]["secretKeyRef"]
                assert ref["name"] in secret_names, f"{where}: {ref['name']} is not provided"
                refs += 1
    assert refs >= 2  # database URL and admin token
    cp = find(docs, "Deployment", "meshyard")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in cp["env"]}
    for name in ("MESHYARD_DATABASE_URL", "MESHYARD_ADMIN_TOKEN"):
        assert "secretKeyRef" in env[name]["valueFrom"], name


def test_committed_files_hold_no_secrets() -> None:
    for path in K8S.rglob("*"):
        if not path.is_file():
            continue
        assert path.name != "secrets.env" or not _tracked(path), f"{path} must not be committed"
        if path.suffix not in (".yaml", ".yml"):
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "Secret":
                raise AssertionError(f"{path}: a Secret manifest is committed")
    example = (K8S / "overlays/dev/secrets.env.example").read_text()
    values = [ln.split("=", 1)[1] for ln in example.splitlines()
              if "=" in ln and not ln.startswith("#")]
    assert values and all("CHANGE_ME" in v for v in values), "example holds placeholders only"


def _tracked(path: Any) -> bool:
    import subprocess

    out = subprocess.run(["git", "ls-files", "--error-unmatch", str(path)], cwd=K8S,
                         capture_output=True, check=False)
    return out.returncode == 0


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rbac_is_minimal(rendered: Docs, overlay: str) -> None:
    docs = rendered[overlay]
    assert not [d for d in docs if d["kind"] in ("Role", "RoleBinding")]
    role = find(docs, "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
    binding = find(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "meshyard-ray-worker",
                                    "namespace": NAMESPACES[overlay]}]
    accounts = {d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"}
    assert "meshyard-ray-worker" in accounts
    for doc in docs:
        for where, pod in pod_specs(doc):
            sa = pod.get("serviceAccountName")
            assert sa is None or sa in accounts, f"{where}: unknown service account {sa}"
            # The get-nodes token reaches the worker's init container only.
            for is_init, c in containers(pod):
                mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
                has_token = "/var/run/secrets/kubernetes.io/serviceaccount" in mounts
                assert has_token == (is_init and sa == "meshyard-ray-worker"), \
                    f"{where}/{c['name']}: service account token mounted={has_token}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_control_plane_wiring(rendered: Docs, overlay: str) -> None:
    docs = rendered[overlay]
    dep = find(docs, "Deployment", "meshyard")
    svc = find(docs, "Service", "meshyard")
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    c = dep["spec"]["template"]["spec"]["containers"][0]
    script = " ".join(c["args"])
    # A zero-resource Ray node (a local driver), started without the control plane's secrets.
    assert script.startswith("env -u MESHYARD_ADMIN_TOKEN -u MESHYARD_DATABASE_URL "
                             'ray start --address="$MESHYARD_RAY_ADDRESS" --num-cpus=0 '
                             "--num-gpus=0"), "a zero-resource Ray node: a local driver"
    assert 'exec meshyard serve --ray-address "$MESHYARD_RAY_ADDRESS"' in script
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    env = {e["name"]: e.get("value") for e in c["env"]}
    ray = find(docs, "RayCluster")
    assert env["MESHYARD_RAY_ADDRESS"] == f"{ray['metadata']['name']}-head-svc:6379"
    assert env["MESHYARD_HOST"] == "0.0.0.0"  # inside the pod only; TLS in front
    want = {"dev": 1, "prod": 2}[overlay]
    assert dep["spec"]["replicas"] == want
    if overlay == "prod":
        pdb = find(docs, "PodDisruptionBudget")
        assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    else:
        pg = find(docs, "StatefulSet", "postgres")
        pg_env = {e["name"]: e for e in pg["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert "secretKeyRef" in pg_env["POSTGRES_PASSWORD"]["valueFrom"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_topology_label_flow_is_wired(rendered: Docs, overlay: str) -> None:
    ray = find(rendered[overlay], "RayCluster")
    assert ray["metadata"]["annotations"]["ray.io/overwrite-container-cmd"] == "true"
    (group,) = ray["spec"]["workerGroupSpecs"]
    pod = group["template"]["spec"]
    (init,) = pod["initContainers"]
    worker = pod["containers"][0]
    assert init["command"] == ["meshyard-k8s-node-labels"]
    out = init["args"][init["args"].index("--out") + 1]
    wenv = {e["name"]: e for e in worker["env"]}
    ienv = {e["name"]: e for e in init["env"]}
    assert wenv["MESHYARD_NODE_LABELS_FILE"]["value"] == out
    for env in (wenv, ienv):
        assert env["MESHYARD_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    # Both containers mount the same volume where the file lives.
    def mount_of(c: dict[str, Any]) -> str:
        return next(m["name"] for m in c["volumeMounts"]
                    if out.startswith(m["mountPath"].rstrip("/") + "/"))
    assert mount_of(init) == mount_of(worker)
    script = " ".join(worker["args"])
    assert 'meshyard topo labels --labels-file "$MESHYARD_NODE_LABELS_FILE"' in script
    assert "$KUBERAY_GEN_RAY_START_CMD --labels=" in script
    assert int(worker["resources"]["limits"]["nvidia.com/gpu"]) >= 1


def _mounts_claim(pod: dict[str, Any], container: dict[str, Any], claim: str) -> set[str]:
    """The paths where `container` mounts the PersistentVolumeClaim `claim`."""
    volumes = {v["name"] for v in pod.get("volumes", [])
               if v.get("persistentVolumeClaim", {}).get("claimName") == claim}
    return {m["mountPath"] for m in container.get("volumeMounts", []) if m["name"] in volumes}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_checkpoint_storage_is_one_shared_volume_at_one_path(rendered: Docs,
                                                             overlay: str) -> None:
    """The control plane names the checkpoint storage; it and every GPU worker mount the same
    ReadWriteMany claim at that path (a restart on other workers reads the checkpoints)."""
    docs = rendered[overlay]
    pvc = find(docs, "PersistentVolumeClaim", "meshyard-checkpoints")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    dep = find(docs, "Deployment", "meshyard")
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    path = {e["name"]: e.get("value") for e in c["env"]}["MESHYARD_CHECKPOINT_STORAGE"]
    assert _mounts_claim(pod, c, "meshyard-checkpoints") == {path}
    ray = find(docs, "RayCluster")
    for group in ray["spec"]["workerGroupSpecs"]:
        wpod = group["template"]["spec"]
        assert _mounts_claim(wpod, wpod["containers"][0], "meshyard-checkpoints") == {path}
