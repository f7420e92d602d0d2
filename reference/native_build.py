"""C sources of this package built once per machine, not once per process: compiled with the system's C compiler
(`$CC`, else `cc`) and `-O3 -march=native -fopenmp` into a cache folder, and loaded with ctypes.

A build is keyed by what decides its machine code: the source's bytes, the compiler's command and its `--version`,
the flags and the CPU (/proc/cpuinfo's model name and flags: `-march=native` builds for this CPU only, and a home
folder shared by machines of several kinds must not hand one the other's build). The first process on a machine
compiles (a few seconds); every later one finds the file and loads it in milliseconds.

The folder is `$SSDGEN_OPS_DIR`, else `$XDG_CACHE_HOME/ssdgen/ops`, else `~/.cache/ssdgen/ops`. It is not under
`$SSDGEN_CACHE`, the planner's measurements (which the tests keep per session): a build depends on nothing a
session measures. A build is written to a temporary file in the folder and renamed into place, so two processes
building at once each load a whole file, never a half-written one. Where the folder cannot be written, the build
goes to a temporary folder of this process's own, with one warning: it works, but is rebuilt in every process.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

log = logging.getLogger(__name__)

FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
TIMEOUT_S = 300  # a build on a loaded 2-core machine took 30 s of wall time for 6 s of CPU


class BuildError(RuntimeError):
    """The library could not be built or loaded; the message says why, in one line."""


@dataclass(frozen=True)
class Built:
    lib: ctypes.CDLL
    path: Path  # where it was loaded from (gone already where the cache was not writable)
    compiled: bool  # True: this process compiled it; False: it loaded an earlier process's build


def cache_dir() -> Path:
    if folder := os.environ.get("SSDGEN_OPS_DIR"):
        return Path(folder)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ssdgen" / "ops"


def compiler() -> list[str] | None:
    """The C compiler's command: `$CC` (split as a shell would), else `cc` or `gcc` on the PATH; None: none."""
    if cc := shlex.split(os.environ.get("CC", "")):
        return cc
    found = shutil.which("cc") or shutil.which("gcc")
    return [found] if found else None


def cpu() -> str:
    """This CPU's model name and feature flags (what -march=native builds for)."""
    fields = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            name, _, value = line.partition(":")
            name = name.strip()
            if name in ("model name", "flags", "Features", "CPU part") and name not in fields:
                fields[name] = value.strip()
            if not line.strip() and fields:  # the first processor's block is enough
                break
    except OSError:
        pass
    return json.dumps(fields, sort_keys=True) if fields else f"{platform.machine()} {platform.processor()}"


def _version(cc: list[str]) -> str:
    try:
        done = subprocess.run([*cc, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise BuildError(f"the C compiler {shlex.join(cc)} does not run ({e})") from None
    if done.returncode != 0:
        raise BuildError(f"`{shlex.join(cc)} --version` failed: {done.stderr.strip()[-200:]}")
    return done.stdout


def key(source: bytes, cc: list[str], version: str, flags: tuple[str, ...] = FLAGS, cpu_id: str | None = None) -> str:
    """The build's name in the cache: a hash of everything that decides its machine code."""
    parts = [hashlib.sha256(source).hexdigest(), cc, version, list(flags), cpu_id if cpu_id is not None else cpu()]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:20]


def load(source: str, package: str = __package__) -> Built:
    """The library built from `source` (a C file of `package`): loaded from the cache, or compiled into it first.
    Raises BuildError (no compiler, a failed build, a file that does not load)."""
    cc = compiler()
    if cc is None:
        raise BuildError("no C compiler (cc) found")
    src = resources.files(package).joinpath(source)
    name = f"{Path(source).stem}-{key(src.read_bytes(), cc, _version(cc))}.so"
    path = cache_dir() / name
    if path.is_file():
        try:
            return Built(_open(path), path, compiled=False)
        except BuildError as e:  # damaged (a full disk, a foreign file): built again over it
            log.warning("%s: building it again", e)
    tmp = _scratch(path)
    if tmp is not None:
        _compile(cc, src, tmp)
        os.chmod(tmp, 0o755)  # mkstemp's 0600 would keep other users of a shared SSDGEN_OPS_DIR from loading it
        os.replace(tmp, path)  # atomic: a process loading `path` meanwhile finds the old file or the whole new one
        return Built(_open(path), path, compiled=True)
    folder = Path(tempfile.mkdtemp(prefix="ssdgen-ops-"))
    try:
        _compile(cc, src, folder / name)
        return Built(_open(folder / name), folder / name, compiled=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # a loaded library stays mapped once its file is gone


def _open(path: Path) -> ctypes.CDLL:
    try:
        return ctypes.CDLL(str(path))
    except OSError as e:
        raise BuildError(f"{path} does not load ({e})") from None


def _scratch(path: Path) -> str | None:
    """A new temporary file beside `path` to compile into; None, with one warning, where the folder cannot be
    written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        log.warning("the ops cache %s cannot be written (%s): building in a temporary folder, again in every "
                    "process (SSDGEN_OPS_DIR names another folder)", path.parent, e)
        return None
    os.close(fd)
    return tmp


def _compile(cc: list[str], src, out: str | Path) -> None:
    """Compile `src` into the file `out` (removed again if the build fails)."""
    try:
        with resources.as_file(src) as file:  # a real path: the source includes itself by its own name
            done = subprocess.run([*cc, *FLAGS, "-o", str(out), str(file), "-lm"], capture_output=True, text=True,
                                  timeout=TIMEOUT_S)
        why = None if done.returncode == 0 else done.stderr.strip()[-300:]
    except (OSError, subprocess.SubprocessError) as e:
        why = str(e)
    if why is not None:
        Path(out).unlink(missing_ok=True)
        raise BuildError(f"{shlex.join(cc)} did not build {src.name} ({why})")
