"""Scheduled and cluster-capped runs through Prefect, against Prefect's test server (the `prefect_server`
fixture): `ssdgen serve` as a long-running deployment, infra/prefect.yaml deployed with `prefect deploy` and
run by a process worker, each triggered with a run request (`run_deployment`) and checked by its committed
output; and the `cluster_limit` parameter, which holds slots of a Prefect global concurrency limit while a
run has actors. A cron schedule fires only on a server with a scheduler, which the test server is not: that
test runs `prefect server start` (the `prefect_scheduler_server` fixture)."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ssdgen import QUIET_DEFAULTS
from ssdgen.reference.prompts import eval_prompts

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.usefixtures("prefect_server")


def _write_prompts(path, n):
    rows = [{"prompt_id": r["prompt_id"], "prompt": r["prompt"]} for r in eval_prompts(n)]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return sorted(r["prompt_id"] for r in rows)


def _committed(out: Path):
    man = pq.read_table(out / "manifest.parquet").to_pylist()
    ids = []
    for m in man:
        ids += pq.read_table(m["images_url"].removeprefix("file://"), columns=["prompt_id"]).column(0).to_pylist()
    return man, ids


def _env(**extra) -> dict:
    """The environment of a Prefect subprocess: this session's test server, fast polling, a small Ray."""
    from prefect.settings import PREFECT_API_URL
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "SSDGEN_REPO")}
    env |= {"PREFECT_API_URL": PREFECT_API_URL.value(), "PREFECT_RUNNER_POLL_FREQUENCY": "1",
            "PREFECT_WORKER_QUERY_SECONDS": "1", "SSDGEN_OBJECT_STORE_BYTES": str(100 * 2**20),
            "RAY_AUTH_MODE": "disabled", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    return env | extra


class Background:
    """A subprocess in its own process group (the flow runs it spawns included), killed as a whole."""

    def __init__(self, args: list[str], env: dict, log: Path):
        self.log = log
        self.f = open(log, "wb")
        self.p = subprocess.Popen(args, cwd=ROOT, env=env, stdout=self.f, stderr=subprocess.STDOUT,
                                  start_new_session=True)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            if self.p.poll() is not None:
                break
            try:
                os.killpg(self.p.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.p.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.p.pid, signal.SIGKILL)  # children that outlived the leader
        except ProcessLookupError:
            pass
        self.f.close()


def _wait_for_deployment(name: str, proc: Background | None, timeout: float = 180):
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound
    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as c:
        while True:
            try:
                return c.read_deployment_by_name(name)
            except ObjectNotFound:
                pass
            assert proc is None or proc.p.poll() is None, f"the serving process exited:\n{proc.tail()}"
            assert time.monotonic() < deadline, f"deployment {name} never appeared:\n{proc.tail() if proc else ''}"
            time.sleep(0.5)


def _run_and_check(name: str, proc: Background, out_template: Path, expected: list[str], parameters=None):
    from prefect.deployments import run_deployment
    fr = run_deployment(name=name, parameters=parameters, timeout=400, poll_interval=1)
    assert fr.state.is_completed(), f"{fr.state!r}\n{proc.tail()}"
    # `{date}` in `out` is the run's scheduled date: one folder per scheduled day
    out = Path(str(out_template).replace("{date}", fr.expected_start_time.strftime("%Y-%m-%d")))
    man, ids = _committed(out)
    assert sum(m["ok"] for m in man) == len(expected) and sorted(ids) == expected
    return fr, out


@pytest.mark.slow
def test_ssdgen_serve_deployment_runs_on_request(tmp_path):
    from prefect.client.orchestration import get_client
    src = tmp_path / "prompts.parquet"
    expected = _write_prompts(src, 4)
    out = tmp_path / "renders" / "{date}"
    cron = "0 0 1 1 *"  # once a year: nothing fires by itself during the test
    _ensure_gcl("ssdgen-test-serve", 4)
    # no analytics switches in its environment: ssdgen's own defaults must keep serve and its runs quiet
    env = {k: v for k, v in _env().items() if k not in QUIET_DEFAULTS}
    proc = Background([str(BIN / "ssdgen"), "serve", "--prompts", str(src), "--out", str(out), "--cron", cron,
                       "--name", "test-serve", "--decoder", "ar", "--actors", "1", "--shard-size", "2",
                       "--batch-size", "2", "--cluster-limit", "ssdgen-test-serve"], env, tmp_path / "serve.log")
    try:
        dep = _wait_for_deployment("ssdgen-generate/test-serve", proc)
        settings = dep.parameters["settings"]  # one nested parameter, as infra/prefect.yaml passes it
        assert settings["cluster_limit"] == "ssdgen-test-serve" and settings["actors"] == 1
        with get_client(sync_client=True) as c:
            scheds = c.read_deployment_schedules(dep.id)
        assert [s.schedule.cron for s in scheds] == [cron]
        fr, _ = _run_and_check("ssdgen-generate/test-serve", proc, out, expected)
        from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
        with get_client(sync_client=True) as c:  # the run took its slot of the limit, and gave it back
            deadline = time.monotonic() + 30  # the run's logs reach the API in batches, maybe after its end
            while True:
                logs = c.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[fr.id])))
                if any("1 slot(s) of concurrency limit 'ssdgen-test-serve'" in log.message for log in logs):
                    break
                assert time.monotonic() < deadline, [log.message for log in logs]
                time.sleep(1)
            assert c.read_global_concurrency_limit_by_name("ssdgen-test-serve").active_slots == 0
    finally:
        proc.stop()
    assert "telemetry" not in (tmp_path / "serve.log").read_text(errors="replace").lower()


@pytest.mark.integration
@pytest.mark.slow
def test_ssdgen_serve_cron_fires_on_a_prefect_server(tmp_path, prefect_scheduler_server):
    """The README's `ssdgen serve --cron`, every minute, against a real `prefect server start`: the server's
    scheduler creates the run, the serving process starts it at the minute, it commits `{date}`'s folder,
    and the process stops on SIGTERM without a traceback. No run is requested by hand."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterDeploymentId
    from prefect.settings import PREFECT_API_URL, temporary_settings
    src = tmp_path / "prompts.parquet"
    expected = _write_prompts(src, 4)
    out = tmp_path / "renders" / "{date}"
    env = _env(PREFECT_API_URL=prefect_scheduler_server, PREFECT_HOME=str(tmp_path / "prefect-home"))
    proc = Background([str(BIN / "ssdgen"), "serve", "--prompts", str(src), "--out", str(out), "--cron", "* * * * *",
                       "--name", "test-cron", "--decoder", "ar", "--actors", "1", "--shard-size", "4",
                       "--batch-size", "4"], env, tmp_path / "serve.log")
    try:
        with temporary_settings(updates={PREFECT_API_URL: prefect_scheduler_server}):
            dep = _wait_for_deployment("ssdgen-generate/test-cron", proc)
            deadline = time.monotonic() + 150  # the next minute boundary, then one small run
            with get_client(sync_client=True) as c:
                only_dep = FlowRunFilter(deployment_id=FlowRunFilterDeploymentId(any_=[dep.id]))
                paused = False
                while True:
                    runs = c.read_flow_runs(flow_run_filter=only_dep)
                    started = [r for r in runs if r.state and not r.state.is_scheduled()]
                    if started and not paused:  # no second run next minute, should this one take longer
                        c.pause_deployment(dep.id)
                        paused = True
                    if started and started[0].state.is_final():
                        break
                    assert proc.p.poll() is None, f"the serving process exited:\n{proc.tail()}"
                    assert time.monotonic() < deadline, f"{[(r.name, r.state) for r in runs]}\n{proc.tail()}"
                    time.sleep(1)
        assert len(started) == 1, [(r.name, r.state) for r in started]
        fr = started[0]
        assert fr.state.is_completed(), f"{fr.state!r}\n{proc.tail()}"
        # created by the schedule: auto-scheduled, at a minute boundary, started when it was due (the runner
        # fetches due runs a little ahead and may start one a fraction of a second early: the clocks are two)
        assert fr.auto_scheduled and fr.expected_start_time.second == 0, fr
        assert abs((fr.start_time - fr.expected_start_time).total_seconds()) < 30, fr
        day = Path(str(out).replace("{date}", fr.expected_start_time.strftime("%Y-%m-%d")))
        man, ids = _committed(day)
        assert sum(m["ok"] for m in man) == len(expected) and sorted(ids) == expected
        os.kill(proc.p.pid, signal.SIGTERM)  # as systemd or Kubernetes stops it
        rc = proc.p.wait(timeout=60)
        log = proc.log.read_text(errors="replace")
        assert rc == 0 and "Traceback" not in log, f"rc={rc}\n{log[-4000:]}"
    finally:
        proc.stop()


@pytest.mark.integration
def test_ssdgen_serve_refuses_without_a_reachable_prefect_server(tmp_path):
    """Without PREFECT_API_URL Prefect would serve against its temporary API, which has no scheduler; with a
    URL nobody answers at, nothing could schedule either: one `error:` line each, before any model loads."""
    import socket
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API_")}
    env |= {"PREFECT_HOME": str(tmp_path / "prefect-home")}  # no user profile's URL
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}/api"
    args = [str(BIN / "ssdgen"), "serve", "--prompts", str(tmp_path / "p.parquet"), "--out", str(tmp_path / "o"),
            "--cron", "* * * * *", "--decoder", "ar"]
    for extra, needle in (({}, "run 'prefect server start' and set PREFECT_API_URL="),
                          ({"PREFECT_API_URL": closed},
                           f"the Prefect API at PREFECT_API_URL={closed} does not answer")):
        r = subprocess.run(args, cwd=ROOT, env=env | extra, capture_output=True, text=True, timeout=120)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], \
            (r.returncode, r.stdout, r.stderr)
        assert "being served" not in r.stdout + r.stderr and not (tmp_path / "o").exists()


def _prefect(*args, env: dict, timeout: float = 240) -> str:
    r = subprocess.run([str(BIN / "prefect"), "--no-prompt", *args], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=timeout)
    assert r.returncode == 0, f"prefect {' '.join(args)}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def _ensure_gcl(name: str, limit: int) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectAlreadyExists
    with get_client(sync_client=True) as c:
        try:
            c.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=limit))
        except ObjectAlreadyExists:
            pass


@pytest.mark.slow
def test_infra_prefect_yaml_deploys_and_runs_on_a_process_worker(tmp_path):
    """The README's steps for infra/prefect.yaml, with a process worker on this checkout. The run overrides
    the bucket URLs and the GPU sizing with local, CPU values; the rest (entrypoint, pull step, work pool,
    the `ssdgen-gpus` cluster limit) is the file as shipped."""
    from prefect.client.orchestration import get_client
    import yaml
    spec = yaml.safe_load((ROOT / "infra" / "prefect.yaml").read_text())
    dep_spec = spec["deployments"][0]
    pool = dep_spec["work_pool"]["name"]
    env = _env()
    _prefect("work-pool", "create", pool, "--type", "process", "--overwrite", env=env)
    # SSDGEN_REPO unset: resolved at run time
    _prefect("deploy", "--all", "--prefect-file", "infra/prefect.yaml", env=env)
    limit = dep_spec["parameters"]["settings"].get("cluster_limit")
    if limit:
        _ensure_gcl(limit, 8)  # `prefect gcl create ssdgen-gpus --limit 8`
    name = f"ssdgen-generate/{dep_spec['name']}"
    dep = _wait_for_deployment(name, None, timeout=30)
    with get_client(sync_client=True) as c:
        for s in c.read_deployment_schedules(dep.id):  # no scheduled run against the example bucket
            c.update_deployment_schedule(dep.id, s.id, active=False)
    src = tmp_path / "prompts.parquet"
    expected = _write_prompts(src, 4)
    out = tmp_path / "renders" / "{date}"
    worker = Background([str(BIN / "prefect"), "worker", "start", "--pool", pool, "--type", "process"],
                        _env(SSDGEN_REPO=str(ROOT)), tmp_path / "worker.log")
    try:
        # the deployment's settings with the test's inputs and a CPU's resources: a whole `settings` replaces the
        # deployment's (Prefect merges parameters at the top level only)
        params = {"settings": dep_spec["parameters"]["settings"] | {
            "prompts": [str(src)], "out": str(out), "decoder": "ar", "shard_size": 2, "batch_size": 2, "actors": 1,
            "cpus_per_actor": 1.0, "gpus_per_actor": 0.0, "device_type": "cpu"}}
        fr, _ = _run_and_check(name, worker, out, expected, parameters=params)
        assert fr.parameters["settings"]["cluster_limit"] == limit  # the deployment's own value, kept
    finally:
        worker.stop()


def test_cluster_limit_holds_slots_while_actors_run(tmp_path, local_ray):
    from prefect.client.orchestration import get_client
    from ssdgen.flows.pipeline import RunSettings, generate
    _ensure_gcl("ssdgen-test-cap", 3)
    src = tmp_path / "p.parquet"
    expected = _write_prompts(src, 4)
    seen, result = [], {}

    def run():
        try:
            result["s"] = generate(RunSettings(prompts=[str(src)], out=str(tmp_path / "run"), decoder="ar", actors=2,
                                               shard_size=2, batch_size=2, cluster_limit="ssdgen-test-cap"),
                                   progress=False)
        except BaseException as e:  # noqa: BLE001
            result["e"] = e

    th = threading.Thread(target=run, daemon=True)
    th.start()
    with get_client(sync_client=True) as c:
        while th.is_alive():
            seen.append(c.read_global_concurrency_limit_by_name("ssdgen-test-cap").active_slots)
            time.sleep(0.2)
        th.join()
        after = c.read_global_concurrency_limit_by_name("ssdgen-test-cap").active_slots
    assert "e" not in result, result.get("e")
    assert result["s"]["images_ok"] == 4 and sorted(_committed(tmp_path / "run")[1]) == expected
    assert max(seen) == 2 and after == 0  # 2 CPU actors: 2 slots while they ran, released at the end


def test_an_unknown_cluster_limit_fails_the_run_before_any_work(tmp_path):
    from ssdgen.flows.pipeline import RunSettings, generate
    src = tmp_path / "p.parquet"
    _write_prompts(src, 2)
    # a limit never created is the user's typo: a ValueError (the CLI's one error: line) naming the fix
    with pytest.raises(ValueError, match="no-such-limit.*must be created.*prefect gcl create no-such-limit"):
        generate(RunSettings(prompts=[str(src)], out=str(tmp_path / "run"), actors=1, shard_size=2, batch_size=2,
                             cluster_limit="no-such-limit"), progress=False)
    assert not (tmp_path / "run" / "shards").exists()
    # slots: the GPUs the actors hold, rounded up; one per actor without GPUs
    slots = lambda **kw: RunSettings(prompts=("x",), **kw).cluster_slots  # noqa: E731
    assert slots(actors=4, gpus_per_actor=1.0, device_type="l4") == 4
    assert slots(actors=3, gpus_per_actor=0.5, device_type="l4") == 2
    assert slots(actors=3) == 3
