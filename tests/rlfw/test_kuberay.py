"""The KubeRay manifests in deploy/kuberay/ are valid KubeRay resources and agree with rlfw's config.

Each RayCluster, RayJob and RayService is validated against its CRD's `openAPIV3Schema` (KubeRay's
schemas, copied to deploy/kuberay/crds/) with jsonschema, read the way the API server reads them
under strict field validation (kubectl's default): an unknown field is an error. CEL rules
(`x-kubernetes-validations`) are not evaluated. No Kubernetes and no GPU are needed.
"""

import copy
import functools
import re
import shlex
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from jsonschema import Draft7Validator
from omegaconf import OmegaConf

from rlfw.config import register_configs
from rlfw.validation import validate

ROOT = Path(__file__).resolve().parents[2]
KUBERAY = ROOT / "deploy" / "kuberay"
MANIFESTS = ["shared-pvc.yaml", "raycluster.yaml", "rayjob.yaml", "rayservice.yaml"]
CRDS = {"RayCluster": "ray.io_rayclusters.yaml", "RayJob": "ray.io_rayjobs.yaml", "RayService": "ray.io_rayservices.yaml"}
SHARED = "/shared"
Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: the CRDs are 0.5-0.7 MB each
register_configs()


def structural(schema: dict) -> dict:
    """A CRD schema node as the API server applies it, in plain JSON Schema: an int-or-string
    field takes either type, and an object with declared properties rejects any other field unless
    it preserves unknown fields (the server's strict field validation; KubeRay's schemas do not say
    `additionalProperties: false` themselves)."""
    s = dict(schema)
    if s.get("x-kubernetes-int-or-string") and "anyOf" not in s:
        s["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if "properties" in s:
        s["properties"] = {name: structural(sub) for name, sub in s["properties"].items()}
        if not s.get("x-kubernetes-preserve-unknown-fields"):
            s.setdefault("additionalProperties", False)
    if isinstance(s.get("additionalProperties"), dict):
        s["additionalProperties"] = structural(s["additionalProperties"])
    if "items" in s:
        s["items"] = structural(s["items"])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in s:
            s[key] = [structural(sub) for sub in s[key]]
    return s


@functools.cache
def crd_schema(kind: str) -> dict:
    crd = yaml.load((KUBERAY / "crds" / CRDS[kind]).read_text(), Loader=Loader)
    assert crd["spec"]["names"]["kind"] == kind
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1" and v["served"]]
    return v1["schema"]["openAPIV3Schema"]


@functools.cache
def validator(kind: str, strict: bool = True) -> Draft7Validator:
    schema = structural(crd_schema(kind)) if strict else crd_schema(kind)
    Draft7Validator.check_schema(schema)
    return Draft7Validator(schema)


def errors(doc: dict, strict: bool = True) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator(doc["kind"], strict).iter_errors(doc)]


@functools.cache
def _load(name: str) -> tuple[dict, ...]:
    return tuple(d for d in yaml.safe_load_all((KUBERAY / name).read_text()) if d)


def manifest(name: str, kind: str) -> dict:
    (doc,) = [d for d in _load(name) if d["kind"] == kind]
    return copy.deepcopy(doc)


def cluster_specs() -> dict[str, dict]:
    """Every RayCluster spec in the manifests, standalone or embedded."""
    return {"raycluster.yaml": manifest("raycluster.yaml", "RayCluster")["spec"],
            "rayjob.yaml": manifest("rayjob.yaml", "RayJob")["spec"]["rayClusterSpec"],
            "rayservice.yaml": manifest("rayservice.yaml", "RayService")["spec"]["rayClusterConfig"]}


def pod_specs(cluster: dict) -> dict[str, dict]:
    pods = {"head": cluster["headGroupSpec"]["template"]["spec"]}
    pods.update({g["groupName"]: g["template"]["spec"] for g in cluster.get("workerGroupSpecs", [])})
    return pods


def count(quantity) -> float:
    """A whole-unit Kubernetes quantity (CPUs, GPUs: `32`, "32"); milli and binary suffixes are not used here."""
    return float(quantity)


def gpu_workers(cluster: dict) -> tuple[int, float, float]:
    """(replicas, GPUs and CPUs per replica) of a cluster's one GPU worker group."""
    (group,) = cluster["workerGroupSpecs"]
    assert group["minReplicas"] == group["replicas"] == group["maxReplicas"], "a fixed-size group"
    (container,) = group["template"]["spec"]["containers"]
    limits = container["resources"]["limits"]
    return group["replicas"], count(limits["nvidia.com/gpu"]), count(limits["cpu"])


def rayjob_config():
    argv = shlex.split(manifest("rayjob.yaml", "RayJob")["spec"]["entrypoint"])
    assert argv[:3] == ["python", "-m", "rlfw.run"], argv
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=argv[3:])
    return OmegaConf.to_object(cfg)


@pytest.mark.parametrize("name", MANIFESTS)
def test_every_manifest_is_valid_against_its_crd(name):
    docs = _load(name)
    assert docs
    for doc in docs:
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"]), doc["metadata"]
        if doc["kind"] == "PersistentVolumeClaim":  # a core resource: no CRD to check it against
            assert doc["apiVersion"] == "v1" and doc["spec"]["accessModes"] == ["ReadWriteMany"]
            continue
        assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] in CRDS, doc["kind"]
        assert errors(doc) == [], f"{name} ({doc['kind']})"


def test_the_schemas_catch_a_wrong_type_a_bad_quantity_and_a_misspelt_field():
    good = manifest("raycluster.yaml", "RayCluster")
    assert errors(good) == []

    wrong_type = copy.deepcopy(good)
    wrong_type["spec"]["workerGroupSpecs"][0]["replicas"] = "three"
    assert any("replicas" in e and "integer" in e for e in errors(wrong_type)), errors(wrong_type)
    assert errors(wrong_type, strict=False)  # KubeRay's schema itself catches types

    quantities = copy.deepcopy(good)
    limits = quantities["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]["limits"]
    limits["nvidia.com/gpu"] = "2"  # int-or-string: a number and its string are both quantities
    assert errors(quantities) == []
    limits["nvidia.com/gpu"] = "two"
    assert any("nvidia.com/gpu" in e for e in errors(quantities)), errors(quantities)

    misspelt = copy.deepcopy(good)
    group = misspelt["spec"]["workerGroupSpecs"][0]
    group["replica"] = group.pop("replicas")
    misspelt["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    assert len(errors(misspelt)) == 2, errors(misspelt)
    # The published schema has no additionalProperties: false; without strict field validation the
    # API server would drop these fields silently, so the test reads the schema strictly.
    assert errors(misspelt, strict=False) == []


def test_the_job_and_service_schemas_catch_a_misspelt_retry_field_and_an_unquoted_serve_config():
    job = manifest("rayjob.yaml", "RayJob")
    job["spec"]["backOffLimit"] = job["spec"].pop("backoffLimit")
    assert [e for e in errors(job) if "backOffLimit" in e], errors(job)
    service = manifest("rayservice.yaml", "RayService")
    service["spec"]["serveConfigV2"] = yaml.safe_load(service["spec"]["serveConfigV2"])  # must be a string
    assert [e for e in errors(service) if e.startswith("spec.serveConfigV2")], errors(service)


@pytest.mark.parametrize("name", ["raycluster.yaml", "rayjob.yaml", "rayservice.yaml"])
def test_every_pod_mounts_the_shared_read_write_many_volume_at_shared(name):
    (pvc,) = _load("shared-pvc.yaml")
    for role, pod in pod_specs(cluster_specs()[name]).items():
        claimed = [v["name"] for v in pod["volumes"]
                   if v.get("persistentVolumeClaim", {}).get("claimName") == pvc["metadata"]["name"]]
        assert len(claimed) == 1, (name, role)
        for container in pod["containers"]:
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            assert mounts.get(SHARED) == claimed[0], (name, role, container["name"])


def test_every_image_is_the_one_the_dockerfile_builds_and_ray_is_the_pinned_one():
    built = re.search(r"docker build -f deploy/docker/Dockerfile -t (\S+) \.",
                      (ROOT / "deploy/docker/Dockerfile").read_text()).group(1)
    ray_pin = re.search(r"^ray==(\S+)$", (ROOT / "deploy/docker/constraints-gpu.txt").read_text(), re.M)
    for name, cluster in cluster_specs().items():
        assert cluster["rayVersion"] == ray_pin.group(1), name
        for role, pod in pod_specs(cluster).items():
            assert {c["image"] for c in pod["containers"]} == {built}, (name, role)
        assert cluster["headGroupSpec"]["rayStartParams"]["num-gpus"] == "0", name


def test_the_rayjob_makes_the_cluster_of_raycluster_yaml_and_retries():
    specs = cluster_specs()
    assert specs["rayjob.yaml"] == specs["raycluster.yaml"]
    job = manifest("rayjob.yaml", "RayJob")["spec"]
    assert job["shutdownAfterJobFinishes"] is True
    assert job["backoffLimit"] >= 1  # each retry runs on a new cluster and resumes (resume_mode=latest)


def test_the_rayjob_entrypoint_composes_validates_and_fits_the_cluster():
    cfg = rayjob_config()
    validate(cfg, environment=False)
    t, c = cfg.trainer, cfg.cluster
    assert c.name == "hyperpod_g7e" and c.ray_address == "auto"
    assert t.resume_mode == "latest" and t.ckpt_interval > 0
    for key, path in {"trainer.output_dir": t.output_dir, "trainer.ckpt_path": t.ckpt_path,
                      "trainer.export_path": t.export_path, "trainer.lora_sync_path": t.lora_sync_path,
                      "model.path": cfg.model.path}.items():
        assert Path(path).is_relative_to(SHARED), (key, path)

    replicas, gpus, cpus = gpu_workers(cluster_specs()["rayjob.yaml"])
    assert c.colocate_all and c.gpus_per_worker == 1
    assert replicas * gpus == c.trainer_ranks == c.num_engines  # one bundle (rank + engine) per GPU
    assert cpus >= gpus / c.gpus_per_worker * c.cpus_per_worker  # the bundles a worker holds fit its CPUs


def test_the_rayservice_serves_the_trained_model_and_its_adapters():
    service = manifest("rayservice.yaml", "RayService")["spec"]
    (app,) = yaml.safe_load(service["serveConfigV2"])["applications"]
    assert app["import_path"] == "rlfw.serve.app:build_app"  # Ray Serve LLM's app behind rlfw's checks
    (llm,) = app["args"]["llm_configs"]
    cfg = rayjob_config()
    source = llm["model_loading_config"]["model_source"]
    assert Path(source).is_relative_to(SHARED) and source == cfg.model.path
    lora, engine = llm["lora_config"], llm["engine_kwargs"]
    assert lora["dynamic_lora_loading_path"].startswith("s3://")  # Ray Serve LLM loads adapters from remote storage
    assert engine["enable_lora"] is True and engine["max_lora_rank"] == cfg.model.lora.rank
    assert engine["max_loras"] == lora["max_num_adapters_per_replica"]

    replicas, gpus, _ = gpu_workers(service["rayClusterConfig"])
    per_replica = engine.get("tensor_parallel_size", 1)
    assert llm["deployment_config"]["num_replicas"] * per_replica <= replicas * gpus
