"""Shared fixtures: the bundled reference model (loaded once per session) and environment for services."""

import os

import pytest

import ssdgen  # noqa: F401  its import sets QUIET_DEFAULTS: no Prefect or Ray usage reporting in any test

# Every Ray the tests start is on this machine and listens on 127.0.0.1 only: Ray's single-machine mode is on
# before any test imports ray (flows/cluster.py explains the switch), for ray.init, ray.cluster_utils (the
# multi-node tests) and the subprocesses' own Rays alike. That is why, and the only case where, auth is off.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# The planner's profile cache (workers/plan_cache.py) of this test session only: a test plans from measurements
# it made, never from the user's ~/.cache or from an earlier session's machine load.
if "SSDGEN_CACHE" not in os.environ:
    import tempfile
    os.environ["SSDGEN_CACHE"] = tempfile.mkdtemp(prefix="ssdgen-test-cache-")


# Tests that use these start a service (Prefect's API, moto's S3 server, a local Ray): marked `integration`
# here, so `-m "not slow and not integration"` is the fast tier. Tests that start a subprocess say so
# themselves with @pytest.mark.integration.
SERVICE_FIXTURES = {"prefect_server", "s3_endpoint", "s3", "s3_faults", "local_ray"}


def pytest_collection_modifyitems(items):
    for item in items:
        if SERVICE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def ref_model():
    from ssdgen.reference.model import ReferenceModel
    return ReferenceModel()


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    """Prefect's test harness: a temporary database behind a real API server subprocess."""
    from prefect.testing.utilities import prefect_test_harness
    with prefect_test_harness(server_startup_timeout=90):
        yield


@pytest.fixture(scope="session")
def s3_endpoint():
    """moto in server mode on 127.0.0.1 (as s3fs's own tests do), reached through botocore's standard
    AWS_ENDPOINT_URL, so every process and every client library talks to the same real HTTP endpoint."""
    from moto.server import ThreadedMotoServer
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    saved = {k: os.environ.get(k) for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                            "AWS_DEFAULT_REGION", "AWS_PROFILE")}
    os.environ.update({"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing-key-id",
                       "AWS_SECRET_ACCESS_KEY": "testing-secret", "AWS_DEFAULT_REGION": "us-east-1"})
    os.environ.pop("AWS_PROFILE", None)
    yield endpoint
    server.stop()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def s3(s3_endpoint):
    """A fresh moto state and an s3fs filesystem for one test."""
    import requests
    import s3fs
    requests.post(f"{s3_endpoint}/moto-api/reset", timeout=10)
    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem()
    fs.mkdir("ssdgen-test")
    yield fs
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def s3_faults(s3, s3_endpoint, monkeypatch):
    """The `s3` fixture's fresh bucket behind a fault proxy (tests/s3_proxy.py): every client this process makes
    from now on, and every process it starts, talks to the proxy (AWS_ENDPOINT_URL). Yields the proxy; a test
    adds its rules (`proxy.add("PUT", r"/_SUCCESS", "lose")`)."""
    import s3fs
    from s3_proxy import S3FaultProxy
    with S3FaultProxy(s3_endpoint) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        s3fs.S3FileSystem.clear_instance_cache()  # cached clients hold moto's endpoint
        yield proxy
        s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def local_ray():
    """A real local Ray with fixed resources (2 CPUs) and a small object store, on 127.0.0.1 only and without
    auth, as a local run starts it (flows.cluster.start_local). Started once and kept up; started again if a
    test (the multi-node ones) shut it down to connect to another cluster."""
    import ray
    from ssdgen.flows.cluster import start_local
    if not ray.is_initialized():
        start_local(num_cpus=2, object_store_memory=256 * 2**20)
    yield ray


@pytest.fixture
def prefect_scheduler_server(tmp_path):
    """A real `prefect server start` on 127.0.0.1, with its scheduler: the test harness's server runs as an
    ephemeral one (PREFECT__SERVER_EPHEMERAL), which starts no scheduler, so cron schedules never create runs
    there. The scheduler loops every second and services a scheduled run does not need are off, to stay light
    on a small machine. Yields the API URL (for PREFECT_API_URL)."""
    import signal
    import socket
    import subprocess
    import sys
    import time
    import urllib.request
    from pathlib import Path
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API_", "PREFECT_SERVER_DATABASE"))}
    env |= {"PREFECT_HOME": str(tmp_path / "prefect-home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED": "true",
            "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "5",
            "PREFECT_SERVER_SERVICES_SCHEDULER_RECENT_DEPLOYMENTS_LOOP_SECONDS": "1"}
    for service in ("CANCELLATION_CLEANUP", "FOREMAN", "LATE_RUNS", "PAUSE_EXPIRATIONS", "REPOSSESSOR", "TRIGGERS"):
        env[f"PREFECT_SERVER_SERVICES_{service}_ENABLED"] = "false"
    log = open(tmp_path / "prefect-server.log", "wb")
    proc = subprocess.Popen([str(Path(sys.executable).parent / "prefect"), "server", "start", "--host", "127.0.0.1",
                             "--port", str(port), "--no-ui"], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}/api"
    deadline = time.monotonic() + 120
    try:
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, \
                (tmp_path / "prefect-server.log").read_text(errors="replace")[-3000:]
            time.sleep(0.5)
        yield url
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=15)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
        log.close()
