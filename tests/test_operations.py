"""The operations suite: the pipeline used as people operate a batch renderer. Each test runs `ssdgen` as a
process of its own, as a user's shell does, and asserts what the user sees: one `error:` line and exit 2 for a
mistake, a clean summary otherwise, never a traceback, and every prompt_id committed exactly once after the
repair. Scenarios: Ctrl-C and SIGTERM, a full disk, deleted and bit-flipped committed files, a corrupt marker,
two drivers at once, an edited input, `--out` as a file and inside `--prompts`, a missing model path, a missing
output bucket, a wrong endpoint, the sockets a local run listens on, and a no-op rerun.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline_helpers import eval_rows, write_parquet

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]


def cli_env(**extra: str) -> dict:
    """The environment of a user's shell: no test harness's Prefect API (a run starts its own temporary
    server), the project importable, `extra` on top."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API_", "RAY_ADDRESS"))}
    return env | {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]), "PYTHONUNBUFFERED": "1"} | extra


def ssdgen(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`ssdgen ARGS` as a process of its own; stdout and stderr captured as text."""
    return subprocess.run([sys.executable, "-m", "ssdgen.cli", *args], env=env or cli_env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def no_traceback(proc) -> None:
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text, text[-4000:]


def one_error(proc, *words: str, rc: int = 2) -> str:
    """Assert exit `rc`, exactly one `error:` line naming every one of `words`, and no traceback."""
    no_traceback(proc)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == rc, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert len(errors) == 1, proc.stderr[-3000:]
    for w in words:
        assert w in errors[0], errors[0]
    return errors[0]


@pytest.fixture
def prompts(tmp_path) -> Path:
    """8 valid prompts in one Parquet file."""
    p = tmp_path / "prompts"
    p.mkdir()
    write_parquet(None, p / "p.parquet", eval_rows(8))
    return p / "p.parquet"


# --- user mistakes, rejected before Prefect or Ray start ----------------------------------------------------
def test_a_decoder_parameter_of_the_wrong_type_is_one_line(prompts, tmp_path):
    proc = ssdgen("generate", "--prompts", str(prompts), "--out", str(tmp_path / "out"), "--decoder", "csd:lam=abc",
                  timeout=60)
    one_error(proc, "decoder spec 'csd:lam=abc'", "lam must be a number", "'abc'")
    assert not (tmp_path / "out").exists()


def test_a_missing_model_checkpoint_is_one_line(prompts, tmp_path):
    proc = ssdgen("generate", "--prompts", str(prompts), "--out", str(tmp_path / "out"), "--model",
                  "janus:/nonexistent", timeout=60)
    one_error(proc, "janus:/nonexistent", "no such checkpoint folder")
    assert not (tmp_path / "out").exists()


def test_a_wrong_storage_endpoint_is_one_line_in_seconds(tmp_path):
    """Nothing listens at the endpoint: one line naming the URL and the endpoint, within seconds (one quick
    probe, not s3fs's and botocore's retries), and no credential in it."""
    import time
    env = cli_env(AWS_ENDPOINT_URL="http://127.0.0.1:9", AWS_ACCESS_KEY_ID="AKIDOPSDEADENDPOINT",
                  AWS_SECRET_ACCESS_KEY="ops-dead-endpoint-secret", AWS_DEFAULT_REGION="us-east-1")
    t0 = time.monotonic()
    proc = ssdgen("generate", "--prompts", "s3://b/p/", "--out", str(tmp_path / "out"), env=env, timeout=60)
    took = time.monotonic() - t0
    line = one_error(proc, "s3://b/p/", "cannot reach the storage endpoint http://127.0.0.1:9", "connection refused",
                     "AWS_ENDPOINT_URL")
    assert "ops-dead-endpoint-secret" not in proc.stdout + proc.stderr and "AKIDOPS" not in line
    assert took < 10, took



# --- listening sockets --------------------------------------------------------------------------------------

def _loopback(ip: str) -> bool:
    import ipaddress
    a = ipaddress.ip_address(ip)
    return a.is_loopback or (a.version == 6 and a.ipv4_mapped is not None and a.ipv4_mapped.is_loopback)


def _session(sid: int) -> dict:
    """pid -> command line of every process in session `sid`: the run, its Prefect server, its Ray (GCS,
    raylet, agents, autoscaler, workers) and anything they started, reparented or not."""
    import psutil
    found = {}
    for p in psutil.process_iter(["cmdline"]):
        try:
            if os.getsid(p.pid) == sid:
                found[p.pid] = " ".join(p.info["cmdline"] or [])
        except (ProcessLookupError, PermissionError):
            continue
    return found


def _listening(sid: int) -> set:
    """(address, port, program) of every LISTEN socket of session `sid`'s processes."""
    import psutil
    procs = {pid: Path(cmd.split(" ")[0]).name for pid, cmd in _session(sid).items()}
    return {(c.laddr.ip, c.laddr.port, procs[c.pid]) for c in psutil.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN and c.pid in procs}


def _user_env() -> dict:
    """A user's shell as the Makefile leaves it: without the test session's Ray switches (tests/conftest.py), so
    what is checked is what flows/cluster.py itself does."""
    return {k: v for k, v in cli_env().items() if k not in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_AUTH_MODE")}


def test_a_local_run_listens_on_loopback_only_and_completes(tmp_path, prompts):
    """Every socket the run's processes listen on, sampled while its actor exists: 127.0.0.1 or ::1 only
    (gRPC's ::ffff:127.0.0.1 included), Ray's GCS and raylet among them; no Ray token is generated for it."""
    import time
    token = Path.home() / ".ray" / "auth_token"
    had_token = token.exists()
    log = tmp_path / "run.log"
    with open(log, "wb") as f:
        p = subprocess.Popen([sys.executable, "-m", "ssdgen.cli", "generate", "--prompts", str(prompts), "--out",
                              str(tmp_path / "run"), "--decoder", "ar", "--shard-size", "4", "--batch-size", "4",
                              "--actors", "1", "--no-progress"], env=_user_env(), cwd=ROOT, stdout=f,
                             stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not any("DecodeWorker" in c for c in _session(p.pid).values()):
            assert p.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        seen = set()
        for _ in range(5):
            seen |= _listening(p.pid)
            time.sleep(0.3)
        rc = p.wait(timeout=180)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
    text = log.read_text()
    assert rc == 0 and "Traceback" not in text, text[-3000:]
    progs = {prog for _, _, prog in seen}
    assert {"gcs_server", "raylet"} <= progs and any("DecodeWorker" in x for x in progs), progs  # Ray was sampled
    wide = sorted(s for s in seen if not _loopback(s[0]))
    assert not wide, f"listening beyond loopback: {wide}"
    assert had_token or not token.exists(), "the local run generated a Ray token: it ran with token auth"


def test_an_actor_larger_than_the_machine_is_one_line_at_once(tmp_path, prompts):
    """--cpus-per-actor beyond every node of the local Ray: refused before any actor is requested (it would
    wait forever for a node that never joins), in one line that says what fits."""
    import time
    t0 = time.monotonic()
    r = ssdgen("generate", "--prompts", str(prompts), "--out", str(tmp_path / "run"), "--decoder", "ar",
               "--actors", "1", "--cpus-per-actor", "1024", "--no-progress", env=_user_env(), timeout=120)
    line = one_error(r, "--cpus-per-actor 1024: no Ray node has 1024 CPUs (largest: ", "or less")
    assert time.monotonic() - t0 < 60, line


# --- interrupts ---------------------------------------------------------------------------------------------

def start(args: list[str], log: Path) -> subprocess.Popen:
    """`ssdgen ARGS` in a session of its own (as a shell's job), its output to `log`."""
    with open(log, "wb") as f:
        return subprocess.Popen([sys.executable, "-m", "ssdgen.cli", *args], env=cli_env(), cwd=ROOT,
                                stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def wait_for(cond, proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    import time
    deadline = time.monotonic() + timeout
    while not cond():
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)


def session_processes(sid: int) -> list:
    import psutil
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getsid(p.pid) == sid:
                found.append(p)
        except (ProcessLookupError, PermissionError):
            continue
    return found


def stopped_cleanly(proc: subprocess.Popen, log: Path, rc: int, within: float) -> str:
    """The run ended with `rc` within `within` seconds, its last line says what was committed, no traceback,
    and nothing it started is left running."""
    import time
    try:
        proc.wait(timeout=within)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        raise AssertionError(f"still running {within} s after the signal: {log.read_text()[-3000:]}") from None
    text = log.read_text()
    assert proc.returncode == rc, text[-3000:]
    assert "Traceback" not in text, text[-4000:]
    last = text.strip().splitlines()[-1]
    assert last.startswith("interrupted") and last.endswith("; run the same command to resume"), last
    deadline = time.monotonic() + 10
    while (left := session_processes(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, [p.cmdline() for p in left]
    return last


def test_ctrl_c_stops_a_run_cleanly_a_second_driver_is_refused_and_a_rerun_completes(tmp_path):
    import signal
    write_parquet(None, tmp_path / "p.parquet", eval_rows(48))
    out = tmp_path / "run"
    args = ["generate", "--prompts", str(tmp_path / "p.parquet"), "--out", str(out), *RUN_ARGS]
    a = start(args, tmp_path / "a.log")
    wait_for(lambda: any(out.glob("shards/*/_SUCCESS.json")), a, tmp_path / "a.log")
    second = ssdgen(*args)  # the same output while the first run holds it
    one_error(second, "another ssdgen run is writing here", f"pid {a.pid}")
    os.killpg(a.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground process group
    last = stopped_cleanly(a, tmp_path / "a.log", 130, within=20)
    committed = len(list(out.glob("shards/*/_SUCCESS.json")))
    assert last.startswith(f"interrupted: {committed}/12 "), last
    # #49: the images decoded in shards that did not commit are said (a shard commits whole), when there are any
    assert re.fullmatch(r"interrupted: \d+/12 shards committed(; \d+ decoded images? not committed \(a shard commits "
                        r"whole: the same command decodes them again\))?; run the same command to resume", last), last
    assert committed < 12 and not list(out.rglob("*.tmp-*"))
    assert "Interrupted: interrupted" not in (tmp_path / "a.log").read_text()
    st = json.loads(ssdgen("status", str(out), "--json").stdout)  # stopped shards are pending, not failed
    assert st["interrupted"] and st["shards_failed"] == {} and st["shards_pending"] == 12 - committed, st
    again = ssdgen(*args)
    no_traceback(again)
    assert again.returncode == 0, again.stderr[-3000:]
    ids = prompt_ids(out)
    assert len(ids) == 48 and len(set(ids)) == 48


def test_the_progress_bar_keeps_a_line_of_its_own(tmp_path):
    """Log lines printed while the bar shows start on their own line: what a terminal shows of each line (the
    text after its last carriage return) is the bar or a log line, never both."""
    write_parquet(None, tmp_path / "p.parquet", eval_rows(12))
    args = [a for a in RUN_ARGS if a != "--no-progress"]
    proc = ssdgen("generate", "--prompts", str(tmp_path / "p.parquet"), "--out", str(tmp_path / "run"), *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shown = [line.split("\r")[-1] for line in (proc.stdout + proc.stderr).split("\n")]
    assert any("generate:" in s for s in (proc.stdout + proc.stderr).split("\r")), proc.stderr[-2000:]
    assert [s for s in shown if "| INFO" in s and "generate:" in s] == []


# 1.5 s: the second lands while the local Ray shuts down after the first (once a bare KeyboardInterrupt there)
@pytest.mark.parametrize("gap", [0.3, 1.5])
def test_a_second_ctrl_c_stops_at_once(tmp_path, gap):
    import signal
    import time
    write_parquet(None, tmp_path / "p.parquet", eval_rows(8))
    out = tmp_path / "run"
    p = start(["generate", "--prompts", str(tmp_path / "p.parquet"), "--out", str(out), *RUN_ARGS], tmp_path / "t.log")
    wait_for(lambda: "Started a local Ray" in (tmp_path / "t.log").read_text(), p, tmp_path / "t.log")
    os.killpg(p.pid, signal.SIGINT)
    time.sleep(gap)
    os.killpg(p.pid, signal.SIGINT)
    stopped_cleanly(p, tmp_path / "t.log", 130, within=8)


def test_sigterm_while_starting_stops_at_once(tmp_path):
    import signal
    write_parquet(None, tmp_path / "p.parquet", eval_rows(8))
    out = tmp_path / "run"
    p = start(["generate", "--prompts", str(tmp_path / "p.parquet"), "--out", str(out), *RUN_ARGS], tmp_path / "t.log")
    # in the flow with the settings recorded, Ray starting (the lease alone comes before the settings are written:
    # a signal between the two leaves nothing recorded, and the rerun below would have nothing to replace)
    wait_for(lambda: any(out.glob("_lease/*.json")) and (out / "_config.json").exists(), p, tmp_path / "t.log")
    p.send_signal(signal.SIGTERM)
    assert stopped_cleanly(p, tmp_path / "t.log", 143, within=20).startswith("interrupted")
    assert not list(out.glob("_lease/*.json"))  # the lease was given back
    # nothing was committed, so the settings are not pinned yet: a rerun may change them
    base = ["generate", "--prompts", str(tmp_path / "p.parquet"), "--out", str(out), "--decoder", "ar",
            "--shard-size", "4", "--actors", "1", "--no-progress"]
    other = ssdgen(*base, "--batch-size", "2")
    no_traceback(other)
    assert other.returncode == 0 and "taking the new ones" in other.stdout + other.stderr, other.stderr[-3000:]
    # now they are: the old settings are refused, until --overwrite says what it deletes and starts anew
    one_error(ssdgen(*base, "--batch-size", "4"), "batch_size", "--overwrite")
    again = ssdgen(*base, "--batch-size", "4", "--overwrite")
    no_traceback(again)
    assert again.returncode == 0 and "--overwrite: deleting the run at" in again.stdout, again.stderr[-3000:]
    assert json.loads((out / "_config.json").read_text())["batch_size"] == 4
    ids = prompt_ids(out)
    assert len(ids) == 8 and len(set(ids)) == 8


# --- faults and tampering -----------------------------------------------------------------------------------


# --- the output: a file, inside the prompts, a missing bucket -----------------------------------------------

def test_out_that_is_a_file_or_inside_the_prompts_is_refused(tmp_path, prompts):
    afile = tmp_path / "not-a-folder"
    afile.write_text("x")
    one_error(ssdgen("generate", "--prompts", str(prompts), "--out", str(afile)), str(afile), "is a file")
    folder = prompts.parent
    p = ssdgen("generate", "--prompts", str(folder), "--out", str(folder / "run1"))
    one_error(p, "inside --prompts", str(folder))
    assert not (folder / "run1").exists()


def test_a_missing_output_bucket_is_refused_and_never_created(s3, tmp_path, prompts):
    before = set(s3.ls(""))
    p = ssdgen("generate", "--prompts", str(prompts), "--out", "s3://no-such-bucket/run1")
    one_error(p, "no-such-bucket", "does not exist")
    s3.invalidate_cache()
    assert set(s3.ls("")) == before


# --- one finished run, then what users do to it -------------------------------------------------------------

RUN_ARGS = ("--decoder", "ar", "--shard-size", "4", "--batch-size", "4", "--actors", "1", "--no-progress")


def prompt_ids(out: Path) -> list[str]:
    from pipeline_helpers import committed_tables
    images, _ = committed_tables(str(out))
    return images.column("prompt_id").to_pylist()


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """16 prompts in 4 shards, decoded once; tests copy the run before they damage it."""
    root = tmp_path_factory.mktemp("finished")
    (root / "prompts").mkdir()
    import pyarrow as pa
    import pyarrow.parquet as pq
    # plain, uncompressed: a test can edit a prompt's bytes in place, as an editor that keeps the size would
    pq.write_table(pa.Table.from_pylist(eval_rows(16)), root / "prompts" / "p.parquet", compression="none",
                   use_dictionary=False)
    p = ssdgen("generate", "--prompts", str(root / "prompts" / "p.parquet"), "--out", str(root / "run"), *RUN_ARGS)
    assert p.returncode == 0, p.stderr[-3000:]
    no_traceback(p)
    return root


def copy_run(finished: Path, dst: Path) -> Path:
    import shutil
    shutil.copytree(finished / "run", dst, copy_function=shutil.copy)  # plain cp: mtimes change, content not
    return dst


def test_a_rerun_with_nothing_to_do_starts_nothing_and_keeps_the_totals(finished):
    summary = (finished / "run" / "summary.json").read_bytes()
    p = ssdgen("generate", "--prompts", str(finished / "prompts" / "p.parquet"), "--out", str(finished / "run"),
               *RUN_ARGS)
    no_traceback(p)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "nothing to do: all 4 shards" in p.stdout
    assert "Starting temporary server" not in p.stdout + p.stderr and "Ray" not in p.stdout + p.stderr
    assert (finished / "run" / "summary.json").read_bytes() == summary


def test_damaged_files_are_found_and_a_resume_redecodes_them(finished, tmp_path):
    run = copy_run(finished, tmp_path / "run")
    shards = sorted((run / "shards").iterdir())
    next(shards[0].glob("attempt-*/images.parquet")).unlink()
    stats = next(shards[1].glob("attempt-*/stats.parquet"))
    data = bytearray(stats.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit, same size
    stats.write_bytes(bytes(data))
    (shards[2] / "_SUCCESS.json").write_text('{"shard": 2, "rows": ')  # a torn marker
    intact = (shards[3] / "_SUCCESS.json").read_bytes()

    p = ssdgen("verify", "--read-only", str(run))  # reports only: status, report and export still meet the damage
    no_traceback(p)
    assert p.returncode == 1 and p.stdout.count("damaged: shard") == 3, p.stdout + p.stderr
    assert not list(run.glob("shards/*/_DAMAGED-*"))
    assert "missing" in p.stdout and "SHA-256" in p.stdout and "_SUCCESS.json" in p.stdout
    st = ssdgen("status", str(run))
    no_traceback(st)
    assert st.returncode == 0 and "1 done, 3 pending" in st.stdout and st.stdout.count("damaged:") == 3, st.stdout
    rep = ssdgen("report", str(run), "--html", str(tmp_path / "r.html"))
    no_traceback(rep)
    assert rep.returncode == 0, rep.stderr[-2000:]
    assert "3 damaged shard(s) left out" in (tmp_path / "r.html").read_text()
    exp = ssdgen("export", str(run), "--to", str(tmp_path / "exported"), "--fresh")  # from the markers
    one_error(exp, str(run))  # the first damage it meets, named

    res = ssdgen("generate", "--prompts", str(finished / "prompts" / "p.parquet"), "--out", str(run), *RUN_ARGS)
    no_traceback(res)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "re-decoded 3 damaged shard(s)" in res.stdout, res.stdout[-2000:]
    assert ssdgen("verify", str(run)).returncode == 0
    assert (shards[3] / "_SUCCESS.json").read_bytes() == intact
    ids = prompt_ids(run)
    assert sorted(ids) == sorted(set(ids)) and len(ids) == 16


def test_an_input_edited_in_place_is_noticed_on_resume(finished, tmp_path):
    import pyarrow.parquet as pq
    run = copy_run(finished, tmp_path / "run")
    src = finished / "prompts" / "p.parquet"
    original = src.read_bytes()
    word = pq.read_table(src).column("prompt")[3].as_py().encode()
    assert original.count(word) >= 1
    at = original.index(word)
    edited = original[:at] + bytes([original[at] ^ 0x20]) + original[at + 1:]  # one letter's case, same size
    (run / "shards" / "000001" / "_SUCCESS.json").unlink()  # so the resume has work to do
    try:
        src.write_bytes(edited)
        p = ssdgen("generate", "--prompts", str(src), "--out", str(run), *RUN_ARGS)
    finally:
        src.write_bytes(original)
    one_error(p, str(src), "changed")


# --- a full disk --------------------------------------------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    """A 512 KiB tmpfs (root only: CI runs as root)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mnt)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_ends_in_one_error_and_never_breaks_the_manifest(finished, small_disk):
    import pyarrow.parquet as pq
    run = copy_run(finished, small_disk / "run")
    (run / "shards" / "000003" / "_SUCCESS.json").unlink()  # the resume has a shard to write
    good = (run / "manifest.parquet").read_bytes()
    filler = small_disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:  # fill the disk to the last block
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        # three pages back: the lease and the heartbeat fit, a shard's images and a new manifest do not
        os.ftruncate(fd, max(0, os.fstat(fd).st_size - 3 * 4096))
        os.close(fd)
    args = ["generate", "--prompts", str(finished / "prompts" / "p.parquet"), "--out", str(run), *RUN_ARGS]
    p = ssdgen(*args)
    line = one_error(p, str(run), "No space left on device")
    print(line)
    assert (run / "manifest.parquet").read_bytes() == good, line  # the good manifest is still there, whole
    pq.read_table(run / "manifest.parquet")
    assert not list(run.rglob("*.tmp-*"))
    filler.unlink()
    again = ssdgen(*args)
    no_traceback(again)
    assert again.returncode == 0, again.stderr[-3000:]
    ids = prompt_ids(run)
    assert len(ids) == 16 and len(set(ids)) == 16
