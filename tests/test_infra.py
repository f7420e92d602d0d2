"""Static checks of the deployment files in infra/ against the code they deploy: they catch drift between a
config and the flow, the price table or the Makefile before a cluster or a scheduler does. Fast: no
services, no Ray, no images."""

import inspect
import math
import re
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
INFRA = ROOT / "infra"
YAMLS = sorted(INFRA.glob("*.yaml"))


def _prefect_yaml() -> dict:
    return yaml.safe_load((INFRA / "prefect.yaml").read_text())


def _deployments() -> list[dict]:
    deps = _prefect_yaml()["deployments"]
    assert deps, "infra/prefect.yaml declares no deployment"
    return deps


def test_there_are_the_expected_infra_files():
    names = {p.name for p in INFRA.iterdir()}
    assert {"prefect.yaml", "kuberay-raycluster.yaml", "ray-cluster.yaml", "prefect-worker.yaml", "Dockerfile",
            "wheel-smoke.sh"} <= names
    assert "prices.csv" not in names  # package data now (output/prices.csv): a second copy here would drift


def _no_inline_secrets(containers: list[dict]) -> None:
    for c in containers:
        for e in c.get("env", []):
            if re.search(r"SECRET|KEY|TOKEN|PASSWORD", e["name"]):
                assert "value" not in e and "secretKeyRef" in e["valueFrom"], e["name"]


@pytest.mark.parametrize("path", YAMLS, ids=[p.name for p in YAMLS])
def test_yaml_files_parse(path):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert docs and all(isinstance(d, dict) for d in docs)


def test_kuberay_cluster_has_a_gpu_worker_group_and_no_inline_secrets():
    (rc,) = [d for d in yaml.safe_load_all((INFRA / "kuberay-raycluster.yaml").read_text()) if d]
    assert rc["apiVersion"] == "ray.io/v1" and rc["kind"] == "RayCluster"
    spec = rc["spec"]
    assert spec["enableInTreeAutoscaling"] is True
    assert str(spec["headGroupSpec"]["rayStartParams"]["num-cpus"]) == "0"  # no actors on the head
    gpu_groups = []
    for g in spec["workerGroupSpecs"]:
        assert 0 <= g["minReplicas"] <= g["replicas"] <= g["maxReplicas"], g["groupName"]
        for c in g["template"]["spec"]["containers"]:
            gpus = c["resources"]["limits"].get("nvidia.com/gpu")
            if gpus:
                gpu_groups.append(g)
                assert float(g["rayStartParams"]["num-gpus"]) == float(gpus)  # Ray sees what the pod holds
    assert gpu_groups, "no worker group requests nvidia.com/gpu"
    # the Ray version in the manifest is the one the project pins
    pinned = re.search(r'"ray\[[^\]]*\]==([\d.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert spec["rayVersion"] == pinned
    # credentials only by reference to a Secret
    _no_inline_secrets([c for g in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
                        for c in g["template"]["spec"]["containers"]])


def test_prefect_worker_pod_is_a_zero_resource_ray_node_on_the_right_pool():
    """The driver needs a local Ray node: the worker pod joins the cluster offering nothing, then serves the
    work pool that infra/prefect.yaml deploys to, against the RayCluster's head service."""
    (d,) = [x for x in yaml.safe_load_all((INFRA / "prefect-worker.yaml").read_text()) if x]
    (rc,) = [x for x in yaml.safe_load_all((INFRA / "kuberay-raycluster.yaml").read_text()) if x]
    (c,) = d["spec"]["template"]["spec"]["containers"]
    cmd = " ".join(c["args"])
    assert f"--address={rc['metadata']['name']}-head-svc:6379" in cmd  # KubeRay names the service <cluster>-head-svc
    assert "--num-cpus=0" in cmd and "--num-gpus=0" in cmd
    pools = {dep["work_pool"]["name"] for dep in _deployments()}
    assert re.search(r"prefect worker start --pool (\S+)", cmd).group(1) in pools
    env = {e["name"]: e for e in c["env"]}
    assert env["RAY_ADDRESS"]["value"] == "auto"
    _no_inline_secrets([c])


def test_ray_cluster_launcher_config_has_head_and_l4_workers():
    c = yaml.safe_load((INFRA / "ray-cluster.yaml").read_text())
    assert c["provider"]["type"] == "aws" and c["provider"]["region"]
    types = c["available_node_types"]
    head = types[c["head_node_type"]]
    assert head["resources"]["CPU"] == 0
    workers = [t for n, t in types.items() if n != c["head_node_type"]]
    assert any(t["node_config"]["InstanceType"] == "g6.xlarge" and t["resources"].get("GPU") == 1
               for t in workers)
    for t in workers:
        assert 0 <= t["min_workers"] <= t["max_workers"] <= c["max_workers"]
    from ssdgen.output.cost import load_prices
    assert load_prices()["l4"].instance_type == "g6.xlarge"  # the price row the workers are costed by
    assert any("ssdgen" in cmd and "install" in cmd for cmd in c["setup_commands"])


def test_prefect_entrypoint_loads_and_parameters_match_the_flow_signature(monkeypatch):
    from prefect.flows import load_flow_from_entrypoint
    from ssdgen.flows.pipeline import RunSettings, generate
    sig = inspect.signature(generate.fn)
    # the run's settings are one parameter (and the progress bar, --overwrite's action, and the command's start
    # time for its end-to-end figures, None in a deployment: it counts from its own start): none for tests alone
    assert set(sig.parameters) == {"settings", "progress", "overwrite", "started"}
    assert sig.parameters["settings"].annotation in (RunSettings, "RunSettings")
    required = {n for n, p in sig.parameters.items() if p.default is inspect.Parameter.empty}
    monkeypatch.chdir(ROOT)  # deployments load the entrypoint relative to the repository root
    # Prefect puts the entrypoint's folder (flows/) on sys.path: undo it, or later tests would import
    # flows/*.py as top-level modules
    monkeypatch.setattr(sys, "path", list(sys.path))
    for dep in _deployments():
        loaded = load_flow_from_entrypoint(dep["entrypoint"])
        assert loaded.name == generate.name
        assert set(inspect.signature(loaded.fn).parameters) == set(sig.parameters)
        params = dep["parameters"]
        unknown = set(params) - set(sig.parameters)
        assert not unknown, f"deployment {dep['name']}: parameters the flow does not take: {sorted(unknown)}"
        assert required <= set(params), f"deployment {dep['name']}: missing {sorted(required - set(params))}"
        # the values pass the settings' own validation (types, unknown keys, the decode spec) and their checks
        # against each other (model spec, device type vs GPUs), as the flow validates them
        RunSettings.model_validate(params["settings"]).check()


def test_prefect_schedules_parse_and_templates_are_ones_prefect_resolves():
    from prefect.client.schemas.schedules import CronSchedule
    from prefect.utilities.templating import PLACEHOLDER_CAPTURE_REGEX
    for dep in _deployments():
        assert dep["schedules"]
        for s in dep["schedules"]:
            CronSchedule(cron=s["cron"], timezone=s.get("timezone", "UTC"))  # raises on a bad cron or zone
        assert dep["work_pool"]["name"]
    # `{{ ... }}` that Prefect's placeholder syntax does not match stays literal at run time (e.g. Jinja filters)
    text = (INFRA / "prefect.yaml").read_text()
    for m in re.finditer(r"{{.*?}}", text):
        assert PLACEHOLDER_CAPTURE_REGEX.fullmatch(m.group(0)), f"Prefect will not resolve {m.group(0)!r}"


def _extras(spec: str) -> frozenset:
    m = re.fullmatch(r"""["']?\.(?:\[([^\]]*)\])?["']?""", spec)
    assert m, spec
    return frozenset(e.strip() for e in (m.group(1) or "").split(",") if e.strip())


def _project_installs(lines: list[str]) -> list[frozenset]:
    """Extras of every `pip install [-e] .[extras]` of the project in these shell lines."""
    found = []
    for line in lines:
        if "pip install" not in line:
            continue
        words = line.split("pip install", 1)[1].split()
        found += [_extras(w) for w in words if re.fullmatch(r"""["']?\.(\[[^\]]*\])?["']?""", w)]
    return found


def _makefile_recipe(target: str) -> list[str]:
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(target + ":"))
    body = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        body.append(line.strip())
    return body


def _dockerfile_runs() -> list[str]:
    text = (INFRA / "Dockerfile").read_text().replace("\\\n", " ")
    return [line.strip()[4:] for line in text.splitlines() if line.strip().startswith("RUN ")]


def test_dockerfile_installs_the_project_as_the_makefile_does_for_runtime():
    runtime = _project_installs(_makefile_recipe("$(VENV)/.installed"))
    assert runtime == [frozenset()], runtime  # `pip install -e .`: no extras; `dev` is for tests only
    docker = _project_installs(_dockerfile_runs())
    assert docker and set(docker) == set(runtime), docker
    # torch: the same pinned version (from a CUDA index in the image)
    pin = re.compile(r"torch==([\w.]+)")
    make_torch = {m for line in _makefile_recipe("$(VENV)/.installed") for m in pin.findall(line)}
    docker_torch = {m for line in _dockerfile_runs() for m in pin.findall(line)}
    assert make_torch and docker_torch == make_torch
    # the base image carries the Ray version the project pins
    pinned = re.search(r'"ray\[[^\]]*\]==([\d.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert re.search(rf"rayproject/ray:{re.escape(pinned)}-py311-gpu", (INFRA / "Dockerfile").read_text())


def test_prices_load_and_cover_every_device_type_the_deployments_use():
    from ssdgen.output.cost import load_prices
    prices = load_prices()  # the shipped table, output/prices.csv
    used = {dep["parameters"]["settings"].get("device_type", "cpu") for dep in _deployments()}
    assert used <= set(prices), used - set(prices)
    for dep in _deployments():
        p = dep["parameters"]["settings"]
        gpu = prices[p.get("device_type", "cpu")].unit == "gpu"
        assert gpu == (float(p.get("gpus_per_actor", 0)) > 0), dep["name"]


def _quantity(q) -> float:
    """A Kubernetes quantity ("3", "3500m", "12Gi", 1) as a number."""
    m = re.fullmatch(r"([\d.]+)([a-zA-Z]*)", str(q))
    units = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    return float(m.group(1)) * units[m.group(2)]


def _ray_resources(group: dict) -> dict:
    """The Ray resources of one pod of a KubeRay worker group, as KubeRay derives them (rayStartParams first,
    else the container's limits: num-cpus and num-gpus rounded up to whole numbers, memory in bytes)."""
    params = group["rayStartParams"]
    (c,) = [c for c in group["template"]["spec"]["containers"] if c["name"].startswith("ray")]
    limits = c["resources"]["limits"]

    def pick(key: str, limit: str) -> float:
        return float(params[key]) if key in params else _quantity(limits.get(limit, 0))
    return {"CPU": math.ceil(pick("num-cpus", "cpu")), "GPU": math.ceil(pick("num-gpus", "nvidia.com/gpu")),
            "memory": pick("memory", "memory")}


def test_every_deployments_actor_fits_a_gpu_worker_pod_and_the_pool_fits_the_group():
    """An actor must fit on one node, or it waits forever (flows/cluster.py): each deployment's per-actor CPUs
    and GPUs within what one GPU worker pod gives Ray, and its actors within the group's `maxReplicas` pods.
    Memory: the actors request none from Ray (flows/pipeline.py `_actors`), so the pod's memory is never short."""
    from ssdgen.flows.settings import RunSettings
    (rc,) = [d for d in yaml.safe_load_all((INFRA / "kuberay-raycluster.yaml").read_text()) if d]
    groups = [g for g in rc["spec"]["workerGroupSpecs"] if _ray_resources(g)["GPU"] > 0]
    assert groups, "no GPU worker group"
    for dep in _deployments():
        p = RunSettings.model_validate(dep["parameters"]["settings"]).model_dump()
        need = {"CPU": float(p["cpus_per_actor"]), "GPU": float(p["gpus_per_actor"]), "memory": 0.0}
        fits = [g for g in groups if all(need[k] <= _ray_resources(g)[k] for k in need)]
        shapes = {g["groupName"]: _ray_resources(g) for g in groups}
        assert fits, f"deployment {dep['name']}: an actor needs {need}, a GPU worker pod gives Ray {shapes}"
        per_pod = {g["groupName"]: min(int(_ray_resources(g)[k] // need[k]) for k in ("CPU", "GPU") if need[k] > 0)
                   for g in fits}
        ceiling = sum(per_pod[g["groupName"]] * g["maxReplicas"] for g in fits)
        assert int(p["actors"]) <= ceiling, f"deployment {dep['name']}: {p['actors']} actors, room for {ceiling}"


def test_kuberay_group_resources_are_read_as_kuberay_derives_them():
    group = {"rayStartParams": {"num-gpus": "1"}, "template": {"spec": {"containers": [{"name": "ray-worker",
             "resources": {"limits": {"cpu": "3500m", "memory": "12Gi", "nvidia.com/gpu": 1}}}]}}}
    assert _ray_resources(group) == {"CPU": 4, "GPU": 1, "memory": 12 * 2**30}
    group["rayStartParams"]["num-cpus"] = "2"
    assert _ray_resources(group)["CPU"] == 2
