"""ssdgen as users install it (issue #33): every file read at run time ships as package data, and no entry point
prints Prefect's usage-data banner or a telemetry error, nor reports Ray usage stats, unless the user turns
analytics on. The built wheel itself is run by infra/wheel-smoke.sh (`make wheel-smoke`, CI)."""

import fnmatch
import os
import pty
import select
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from ssdgen import QUIET_DEFAULTS

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# Prefect's client stays quiet in CI whatever ssdgen does (prefect/_internal/analytics/ci_detection.py): without
# these the test would pass there for the wrong reason
CI_VARS = ("CI", "GITHUB_ACTIONS", "GITLAB_CI", "JENKINS_URL", "TRAVIS", "CIRCLECI", "BUILDKITE", "TF_BUILD",
           "CODEBUILD_BUILD_ID", "BITBUCKET_COMMIT", "TEAMCITY_VERSION", "DRONE", "SEMAPHORE", "APPVEYOR",
           "BUDDY", "CI_NAME")
NOT_SHIPPED = ("reference/checkpoints/*",)  # the training run's records, for the docs; nothing reads them


def _user_env(tmp_path: Path, **extra) -> dict:
    """A user's shell: none of the analytics switches, no CI, a fresh PREFECT_HOME (a first-time Prefect user,
    the one the banner is for), Prefect's temporary API (not a test server), no checkout on the path."""
    drop = set(QUIET_DEFAULTS) | set(CI_VARS) | {"PYTHONPATH", "RAY_ADDRESS"}
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("PREFECT_API_")}
    env |= {"PREFECT_HOME": str(tmp_path / "prefect-home"), "SSDGEN_OBJECT_STORE_BYTES": str(100 * 2**20)}
    return env | extra


def _on_a_terminal(args: list[str], env: dict, cwd: Path, timeout: float = 600) -> tuple[int, str]:
    """Run `args` with stdout and stderr on a pseudo-terminal (Prefect shows its banner only on a terminal);
    returns (exit status, everything printed)."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower, env=env, cwd=cwd)
    os.close(follower)
    out, deadline = bytearray(), time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # EIO: every writer closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:  # exited, and a child that kept the terminal writes nothing more
                break
        else:
            proc.kill()
    finally:
        os.close(leader)
    return proc.wait(timeout=30), out.decode(errors="replace")


def _folder(pkg: str, dirs: dict) -> str:
    """A package's folder in the repository, as setuptools maps it (a subpackage sits under its parent's)."""
    head, _, tail = pkg.rpartition(".")
    if pkg in dirs:
        return dirs[pkg]
    return f"{_folder(head, dirs)}/{tail}" if head else pkg


def test_every_data_file_in_the_packages_ships_in_the_wheel():
    """A file next to the code that no package-data pattern matches is missing from the wheel, and whatever
    reads it fails only after `pip install .` (as output/cost.py's price table did)."""
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    package_of = {_folder(pkg, conf.get("package-dir", {})): pkg for pkg in conf["packages"]}
    roots = {folder.split("/")[0] for folder in package_of}
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.splitlines()
    data = [f for f in files if Path(f).parts[0] in roots and not f.endswith(".py") and (ROOT / f).is_file()
            and not any(fnmatch.fnmatch(f, p) for p in NOT_SHIPPED)]
    assert "output/prices.csv" in data and "reference/weights/gpt.safetensors" in data
    loose = [f for f in data if str(Path(f).parent) not in package_of]
    assert not loose, f"data files in a folder that is no listed package (add it to packages): {loose}"
    unshipped = [f for f in data if not any(fnmatch.fnmatch(Path(f).name, p)
                                            for p in conf["package-data"].get(package_of[str(Path(f).parent)], ()))]
    assert not unshipped, f"not in [tool.setuptools.package-data]: {unshipped}"


@pytest.mark.integration
def test_importing_ssdgen_sets_quiet_defaults_and_keeps_the_users_choice(tmp_path):
    code = "import os, ssdgen; print(' '.join(os.environ.get(k, '-') for k in sorted(ssdgen.QUIET_DEFAULTS)))"
    quiet = subprocess.run([sys.executable, "-c", code], env=_user_env(tmp_path), cwd=tmp_path,
                           capture_output=True, text=True, check=True).stdout.split()
    assert quiet == [QUIET_DEFAULTS[k] for k in sorted(QUIET_DEFAULTS)]
    # a user who opts in keeps it; and under this terminal harness Prefect does print its banner then, so the
    # CLI test below would see one
    rc, out = _on_a_terminal([sys.executable, "-c", "import ssdgen, os, prefect; print(os.environ['DO_NOT_TRACK'])"],
                             _user_env(tmp_path, DO_NOT_TRACK="0"), tmp_path, timeout=120)
    assert rc == 0 and out.split()[-1] == "0"
    assert "telemetry" in out.lower(), out


@pytest.mark.integration
@pytest.mark.slow
def test_generate_prints_no_telemetry_on_a_terminal(tmp_path):
    """`ssdgen generate` as a user runs it: on a terminal, no analytics variables set. Prefect would print its
    usage-data banner and its temporary server a red "Failed to send telemetry" line (offline)."""
    from ssdgen.reference.prompts import EXAMPLES_PARQUET
    pq.write_table(pq.read_table(EXAMPLES_PARQUET).slice(0, 4), tmp_path / "prompts.parquet")
    rc, out = _on_a_terminal([str(BIN / "ssdgen"), "generate", "--prompts", "prompts.parquet", "--out", "out",
                              "--decoder", "ar", "--actors", "1", "--batch-size", "4", "--no-progress"],
                             _user_env(tmp_path), tmp_path)
    assert rc == 0, out[-3000:]
    assert "images ok 4" in out, out[-3000:]
    assert "telemetry" not in out.lower() and "usage data" not in out.lower(), out
