"""Shared fixtures: the bundled reference model (loaded once per session) and environment for services."""

import os

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


@pytest.fixture(scope="session")
def ref_model():
    from reference.model import ReferenceModel
    return ReferenceModel()
