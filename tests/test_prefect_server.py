"""Prefect's temporary API server started before Prefect is imported (flows/prefect_server.py, #36 item 7):
the flow's client talks to it through PREFECT_API_URL, it is stopped unused where Prefect's settings name an API,
and nothing of it is left after `stop`."""

import httpx
import pytest


@pytest.mark.integration
def test_the_temporary_server_answers_is_the_flows_api_and_stops(tmp_path, monkeypatch):
    from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL, get_current_settings

    from ssdgen.flows.prefect_server import TemporaryServer
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path))
    server = TemporaryServer().start()
    try:
        assert server.home == tmp_path and (tmp_path / "ssdgen-server-start.lock").exists()
        with server.api():
            assert PREFECT_API_URL.value() == server.url and not PREFECT_UI_URL.value()
            assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200
        assert get_current_settings().api.url != server.url  # only the flow runs under it
        process = server.process
    finally:
        server.stop()
    assert process.poll() is not None and server.process is None


def test_it_is_stopped_unused_where_prefects_settings_name_an_api(tmp_path, monkeypatch):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from ssdgen.flows.prefect_server import TemporaryServer
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path))
    server = TemporaryServer().start()
    process = server.process
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:4200/api"}):  # as a profile would
        assert not server.needed()
    assert process.wait(timeout=10) is not None and server.process is None


def _unwritable(tmp_path):
    """A folder no one can create, root included: its parent is a file."""
    (tmp_path / "a-file").write_text("")
    return tmp_path / "a-file" / "home"


def test_a_home_prefect_cannot_write_is_one_error_naming_prefect_home(tmp_path, monkeypatch):
    """#49: it said `/proc/...: No such file or directory`, not what fixes it."""
    from ssdgen.flows.prefect_server import NoPrefectServer, TemporaryServer
    monkeypatch.delenv("PREFECT_HOME", raising=False)
    monkeypatch.setenv("HOME", str(_unwritable(tmp_path)))
    with pytest.raises(NoPrefectServer) as e:
        TemporaryServer().start()
    assert str(e.value).startswith(f"Prefect's home {_unwritable(tmp_path)}/.prefect (under HOME, as PREFECT_HOME is "
                                   "not set) cannot be written (Not a directory: ")
    assert "set PREFECT_HOME to a writable folder" in str(e.value)
    monkeypatch.setenv("PREFECT_HOME", str(_unwritable(tmp_path)))
    with pytest.raises(NoPrefectServer, match=r"^PREFECT_HOME=\S+/a-file/home cannot be written \(Not a directory"):
        TemporaryServer().start()


@pytest.mark.integration
def test_generate_with_an_unwritable_home_says_to_set_prefect_home(tmp_path):
    from test_operations import cli_env, one_error, ssdgen
    (tmp_path / "p.csv").write_text("prompt\na large red circle at the center on a flat gray background\n")
    env = {k: v for k, v in cli_env(HOME=str(_unwritable(tmp_path))).items() if k != "PREFECT_HOME"}
    proc = ssdgen("generate", "--prompts", str(tmp_path / "p.csv"), "--out", str(tmp_path / "run"), "--decoder", "ar",
                  "--no-progress", env=env)
    one_error(proc, "Prefect's home", "set PREFECT_HOME to a writable folder")


@pytest.mark.integration
def test_a_flow_under_temporary_api_prints_no_server_banner(tmp_path):
    """#49: the Python API's runs start Prefect as the CLI's do (`temporary_api`): a flow run under it talks to
    that server, and Prefect never starts its own ("Starting temporary server ..." on the console)."""
    import subprocess
    import sys
    from test_operations import ROOT, cli_env
    code = ("from ssdgen.flows.prefect_server import temporary_api\n"
            "with temporary_api() as server:\n"
            "    from prefect import flow\n"
            "    with server.api():\n"
            "        print('answer', flow(name='probe')(lambda: 42)(), server is not None)\n")
    # no Prefect API named: the run starts its own; a loaded machine may take longer than Prefect's 20 s to start it
    env = cli_env(PREFECT_HOME=str(tmp_path), PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="120")
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "answer 42 True" in proc.stdout
    assert "Starting temporary server" not in proc.stdout + proc.stderr
