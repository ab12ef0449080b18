"""The YAML and JSON deployment files: they parse, the Kubernetes manifests, the compose file and
the flex template agree with each other and the job, the GPU pool mounts the data volume."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from tests.infra.infra_files import INFRA, REPO

K8S_NAMESPACED = {"ServiceAccount", "Role", "RoleBinding", "Deployment", "Service", "Job",
                  "PersistentVolumeClaim"}


def load_yaml(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def k8s_docs() -> dict[tuple[str, str], dict]:
    docs = {}
    for path in sorted((INFRA / "k8s").glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in load_yaml(path):
            docs[(doc["kind"], doc["metadata"]["name"])] = doc
    return docs


# --- YAML and JSON ---------------------------------------------------------------------------

def test_every_yaml_and_json_file_parses():
    yaml_files = sorted([*INFRA.rglob("*.yaml"), *INFRA.rglob("*.yml")])
    json_files = sorted(INFRA.rglob("*.json"))
    assert len(yaml_files) >= 6 and len(json_files) >= 2
    for path in yaml_files:
        assert load_yaml(path), f"{path} is empty"
    for path in json_files:
        json.loads(path.read_text())


def test_k8s_manifests_have_required_keys_and_agree():
    docs = k8s_docs()
    for (kind, name), doc in docs.items():
        assert doc["apiVersion"] and doc["metadata"]["name"] == name
        if kind in K8S_NAMESPACED:
            assert doc["metadata"]["namespace"] == "bert", (kind, name)
    assert set(docs) == {("Namespace", "bert"), ("ServiceAccount", "prefect-worker"),
                         ("Role", "prefect-worker"), ("RoleBinding", "prefect-worker"),
                         ("Deployment", "prefect-worker"), ("Service", "bert-pretrain"),
                         ("Job", "bert-pretrain"), ("PersistentVolumeClaim", "bert-data")}
    worker = docs[("Deployment", "prefect-worker")]["spec"]
    assert worker["selector"]["matchLabels"].items() <= worker["template"]["metadata"]["labels"].items()
    assert worker["template"]["spec"]["serviceAccountName"] == "prefect-worker"
    binding = docs[("RoleBinding", "prefect-worker")]
    assert binding["roleRef"]["name"] == "prefect-worker"
    command = worker["template"]["spec"]["containers"][0]["command"]
    pool = command[command.index("--pool") + 1]

    # The pool and namespace are the ones prefect.yaml's cluster deployments use.
    prefect = yaml.safe_load((REPO / "prefect.yaml").read_text())
    cluster = [d for d in prefect["deployments"] if d["name"] in ("base", "large")]
    assert cluster and {d["work_pool"]["name"] for d in cluster} == {pool}
    assert {d["work_pool"]["job_variables"]["namespace"] for d in cluster} == {"bert"}

    service = docs[("Service", "bert-pretrain")]["spec"]
    job = docs[("Job", "bert-pretrain")]["spec"]
    pod = job["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert service["clusterIP"] == "None" and service["publishNotReadyAddresses"] is True
    assert service["selector"] == {"job-name": "bert-pretrain"} and pod["subdomain"] == "bert-pretrain"
    assert job["completionMode"] == "Indexed"
    assert job["completions"] == job["parallelism"] == int(env["NNODES"])
    host, port = env["RDZV_ENDPOINT"].split(":")
    assert host == "bert-pretrain-0.bert-pretrain"  # pod index 0 of the Job, via the Service
    assert int(port) == service["ports"][0]["port"] == container["ports"][0]["containerPort"]
    assert container["command"] == ["bash", "/opt/bert-dag/infra/launch/torchrun_rendezvous.sh"]
    assert (REPO / "infra" / "launch" / "torchrun_rendezvous.sh").exists()
    assert container["resources"]["limits"]["nvidia.com/gpu"] == env["NPROC_PER_NODE"]
    claims = {v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
              if "persistentVolumeClaim" in v}
    assert claims == {"bert-data"}

    kustomization = yaml.safe_load((INFRA / "k8s" / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(
        p.name for p in (INFRA / "k8s").glob("*.yaml") if p.name != "kustomization.yaml")
    assert container["image"] in {image["name"] for image in kustomization["images"]}


def test_compose_file_has_a_prefect_server_and_a_worker_that_agree():
    compose = yaml.safe_load((INFRA / "compose" / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) == {"prefect-server", "worker"}
    for name, service in services.items():
        assert "image" in service or "build" in service, name
        for dependency in service.get("depends_on", {}):
            assert dependency in services
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith("."):
                assert source in compose["volumes"], (name, source)
    worker = services["worker"]
    build = worker["build"]
    assert (INFRA / "compose" / build["context"] / build["dockerfile"]).resolve() == \
        REPO / "Dockerfile"
    assert re.search(rf"^FROM \S+ AS {build['target']}$", (REPO / "Dockerfile").read_text(),
                     flags=re.MULTILINE)
    assert worker["environment"]["PREFECT_API_URL"].startswith("http://prefect-server:4200/")
    assert worker["depends_on"]["prefect-server"]["condition"] == "service_healthy"
    command = worker["command"]
    pool = command[command.index("--pool") + 1]
    prefect = yaml.safe_load((REPO / "prefect.yaml").read_text())
    tiny = next(d for d in prefect["deployments"] if d["name"] == "tiny")
    assert tiny["work_pool"]["name"] == pool


def test_flex_template_metadata_validates_and_matches_the_job():
    import jsonschema

    from pipelines import train_vocab

    folder = INFRA / "dataflow" / "flex_template"
    schema = json.loads((folder / "metadata.schema.json").read_text())
    metadata = json.loads((folder / "metadata.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    validator.validate(metadata)
    # the schema is not vacuous
    assert not validator.is_valid({k: v for k, v in metadata.items() if k != "parameters"})
    assert not validator.is_valid({**metadata, "parameters": [{"name": "input"}]})
    assert not validator.is_valid({**metadata, "parameters": [
        {**metadata["parameters"][0], "regexes": ["(unclosed"]}]})

    options = {a.dest: a for a in train_vocab.build_parser()._actions if a.option_strings}
    params = {p["name"]: p for p in metadata["parameters"]}
    assert set(params) <= set(options)
    assert {n for n, p in params.items() if not p.get("isOptional", False)} == \
        {d for d, a in options.items() if a.required}
    examples = {"input": ("gs://b/bert/corpus/", "/local/corpus"),
                "output": ("gs://b/bert/vocab/", ""),
                "vocab_size": ("30522", "30k"), "min_frequency": ("2", "0"),
                "limit_alphabet": ("1000", "-1"), "num_unused_tokens": ("994", "98")}
    assert set(examples) == set(params)
    for name, (good, bad) in examples.items():
        patterns = [re.compile(r) for r in params[name]["regexes"]]
        assert all(p.fullmatch(good) for p in patterns), (name, good)
        assert not all(p.fullmatch(bad) for p in patterns), (name, bad)


def render_job(template: dict, job_variables: dict) -> dict:
    """The Kubernetes Job a `gpu-cluster` worker submits, rendered by Prefect's own templating
    from the pool's template (its variables' defaults, then the deployment's job variables)."""
    from prefect.utilities.templating import apply_values

    properties = template["variables"]["properties"]
    values = {k: v["default"] for k, v in properties.items() if "default" in v}
    return apply_values(template["job_configuration"], {**values, **job_variables})


def test_gpu_cluster_pool_mounts_the_data_volume_for_base_and_large(tmp_path):
    import jsonschema
    import prefect

    template = json.loads((INFRA / "k8s" / "gpu-cluster-job-template.json").read_text())
    bundled = Path(prefect.__file__).parent / "server" / "api" / "collections_data" / "views" / \
        "aggregate-worker-metadata.json"
    default = json.loads(bundled.read_text())["prefect-kubernetes"]["kubernetes"][
        "default_base_job_configuration"]
    # Prefect's default Kubernetes template, with only additions.
    assert default["variables"]["properties"].items() <= template["variables"]["properties"].items()
    assert set(template["variables"]["properties"]) - set(default["variables"]["properties"]) == \
        {"volume_claim", "data_mount", "gpus"}
    jsonschema.Draft7Validator.check_schema(template["variables"])

    prefect_yaml = yaml.safe_load((REPO / "prefect.yaml").read_text())
    claim = yaml.safe_load((INFRA / "k8s" / "data-pvc.yaml").read_text())["metadata"]["name"]
    from flows.pretrain_bert import pretrain_bert

    assert "output" in pretrain_bert.parameters.properties
    for name, gpus in (("base", 1), ("large", 8)):
        deployment = next(d for d in prefect_yaml["deployments"] if d["name"] == name)
        job_variables = {**deployment["work_pool"]["job_variables"], "image": "bert-dag:gpu"}
        jsonschema.validate(job_variables, template["variables"])  # as the server checks them
        job = render_job(template, job_variables)["job_manifest"]
        pod = job["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        # /dev/shm in memory: the 64 MiB default is too small for 8 NCCL ranks' shared-memory
        # transport and their DataLoader workers (as infra/k8s/pretrain-job.yaml)
        assert pod["volumes"] == [
            {"name": "bert-data", "persistentVolumeClaim": {"claimName": claim}},
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}}]
        assert container["volumeMounts"] == [{"name": "bert-data", "mountPath": "/data"},
                                             {"name": "shm", "mountPath": "/dev/shm"}]
        assert container["resources"]["limits"] == {"nvidia.com/gpu": gpus}
        assert container["image"] == "bert-dag:gpu" and job["metadata"]["namespace"] == "bert"
        assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 1000,
                                          "runAsGroup": 1000, "fsGroup": 1000}
        # The run's outputs and checkpoints go to the volume, not the pod's disk.
        assert deployment["parameters"]["output"] == f"/data/runs/{name}"
        # Its data stages alone: same preset and output (so the GPU run reuses them), no GPU.
        data = next(d for d in prefect_yaml["deployments"] if d["name"] == f"data-{name}")
        assert data["parameters"] == {**deployment["parameters"], "data_only": True}
        data_variables = {**data["work_pool"]["job_variables"], "image": "bert-dag:gpu"}
        jsonschema.validate(data_variables, template["variables"])
        data_pod = render_job(template, data_variables)["job_manifest"]["spec"]["template"]["spec"]
        assert data_pod["volumes"] == pod["volumes"]
        assert data_pod["containers"][0]["resources"] == {
            "limits": {}, "requests": {"cpu": "16", "memory": "64Gi"}}
    # Unset variables drop out: a pool job without `gpus` requests none.
    plain = render_job(template, {"image": "x"})["job_manifest"]["spec"]["template"]["spec"]
    assert plain["containers"][0]["resources"]["limits"] == {}

    # The worker creates its pool from that file, mounted from kustomize's ConfigMap.
    worker = k8s_docs()[("Deployment", "prefect-worker")]["spec"]["template"]["spec"]
    command = worker["containers"][0]["command"]
    path = Path(command[command.index("--base-job-template") + 1])
    (mount,) = [m for m in worker["containers"][0]["volumeMounts"]
                if m["mountPath"] == str(path.parent)]
    (volume,) = [v for v in worker["volumes"] if v["name"] == mount["name"]]
    kustomization = yaml.safe_load((INFRA / "k8s" / "kustomization.yaml").read_text())
    (generated,) = [g for g in kustomization["configMapGenerator"]
                    if g["name"] == volume["configMap"]["name"]]
    assert generated["files"] == [path.name] and (INFRA / "k8s" / path.name).is_file()
