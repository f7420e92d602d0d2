"""Shared fixtures: the bundled reference model (loaded once per session) and environment for services."""

import os

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


# Tests that use these start a service (Prefect's API, moto's S3 server, a local Ray): marked `integration`
# here, so `-m "not slow and not integration"` is the fast tier. Tests that start a subprocess say so
# themselves with @pytest.mark.integration.
SERVICE_FIXTURES = {"prefect_server", "s3_endpoint", "s3", "local_ray"}


def pytest_collection_modifyitems(items):
    for item in items:
        if SERVICE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def ref_model():
    from models.reference import ReferenceModel
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
def local_ray():
    """A real local Ray with fixed resources (2 CPUs) and a small object store. Started once and kept up;
    started again if a test (the multi-node ones) shut it down to connect to another cluster."""
    import ray
    if not ray.is_initialized():
        ray.init(num_cpus=2, object_store_memory=256 * 2**20, include_dashboard=False, log_to_driver=False)
    yield ray
