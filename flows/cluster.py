"""The flow's Ray: attach to a cluster (`--ray-address` / RAY_ADDRESS) or start a local one that listens on
127.0.0.1 only; stop it; and, before any actor is requested, check that the actors fit the cluster's nodes.

Loopback. On Linux a plain `ray.init()` gives the node its routable IP, and every Ray server binds that IP or
all interfaces: the GCS, the raylet and its object manager, each worker's gRPC server, the dashboard agent, the
runtime-env agent, the autoscaler's metrics port. Ray 2.60 has no bind-address option for ray.init, and
`_node_ip_address="127.0.0.1"` does not help: ray.init rewrites a loopback address to the routable one
(ray._private.services.resolve_ip_for_localhost). What does work is the single-machine mode Ray uses on macOS and
Windows: with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 the node IP Ray picks is 127.0.0.1, each of those servers binds
it (gRPC as ::ffff:127.0.0.1), and the daemons and workers are told that IP on their command lines. Ray reads the
variable once, at import, into `ray._private.ray_constants.ENABLE_RAY_CLUSTER`, so `_loopback` sets both while
ray.init runs (ray may already be imported: by the tests, by a Python caller). That constant is private, so
`start_local` also checks the result: a node that is not on a loopback address is shut down and the run fails.
tests/test_operations.py checks the sockets of a real `ssdgen generate`.

Authentication. Ray 2.60 turns token authentication on for a new local Ray unless RAY_AUTH_MODE says otherwise
(and writes a token to ~/.ray/auth_token). The local Ray started here is reachable only from this machine, so it
runs with RAY_AUTH_MODE=disabled unless the caller chose a mode; that is the only place ssdgen turns auth off.
Attaching changes nothing: a cluster's driver brings RAY_AUTH_MODE=token and the token (RAY_AUTH_TOKEN, a file
named by RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token) in its environment (docs/deployment.md, infra/).

Placement. An actor that fits no node waits forever: Ray keeps it pending in case a node joins. On the local Ray
no node will join, so an actor larger than the machine is a ValueError, said in one line with what would fit; a
pool larger than the machine is cut to what fits at once (logged). On a cluster the autoscaler may add nodes:
its node types count when Ray publishes them (autoscaler v2's cluster config); when it does not, the check
cannot tell a node type the autoscaler has from one it lacks, and says so in a warning instead of failing (a
KubeRay GPU group scaled to zero has no live node, yet its actors will be placed). `memory` is not checked:
the actors request only `num_cpus` and `num_gpus` (flows/pipeline.py `_actors`).
"""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import re
from contextlib import contextmanager

SINGLE_MACHINE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray's node IP is 127.0.0.1 (ray_constants.py)
EPS = 1e-4  # Ray's resource granularity

_local_gcs: str | None = None  # the GCS address of the local Ray `start_local` started: no node will join it


class ClusterError(RuntimeError):
    """The cluster cannot be used as asked; the message says why (one `error:` line, ssdgen/cli/options.py)."""


# what ray.init takes as an address: the head's GCS host:port (an IPv6 host in brackets), or a Ray Client URL
_ADDRESS = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+):\d{1,5}|ray://\S+")


def check_address(address: str | None) -> None:
    """--ray-address in a form Ray can attach to, checked with the other settings: a typo found by ray.init would
    surface only after Prefect started, inside the flow."""
    if address is None or address in ("auto", "local") or _ADDRESS.fullmatch(address):
        return
    raise ValueError(f"--ray-address {address!r}: not a Ray address; give the head's host:port (e.g. "
                     "10.0.0.5:6379), ray://host:10001 for Ray Client, auto, or local")


def start(address: str | None = None) -> bool:
    """Attach to `address` (else RAY_ADDRESS), or start a local loopback-only Ray. True if this call connected
    (then `stop` disconnects, and shuts down a local Ray); False if Ray was already up (a test's, a caller's)."""
    import ray
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    with _keep_sigterm_handler():
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            start_local(object_store_memory=int(os.environ.get("SSDGEN_OBJECT_STORE_BYTES", 512 * 2**20)))
    return True


@contextmanager
def _keep_sigterm_handler():
    """The caller's SIGTERM handler stays in place while ray.init runs. Ray's init installs one that raises
    SystemExit wherever the main thread is; a SIGTERM in that moment could land in a spot that swallows it
    (logging's lock release did), and the run went on. Ray 2.60 sets it through this private helper."""
    from ray._private import utils
    saved = utils.set_sigterm_handler
    utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        utils.set_sigterm_handler = saved


def start_local(**init_kw) -> None:
    """A new Ray on this machine, listening on 127.0.0.1 only, no dashboard, auth off unless RAY_AUTH_MODE is
    set; `init_kw` go to ray.init (num_cpus, object_store_memory, ...)."""
    global _local_gcs
    import ray
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # loopback only: see the module docstring
    with _loopback():
        # "local": a new Ray even if RAY_ADDRESS names another
        ray.init(address="local", include_dashboard=False, log_to_driver=False, **init_kw)
    ips = {n["NodeManagerAddress"] for n in ray.nodes()}
    if not all(_is_loopback(ip) for ip in ips):
        ray.shutdown()
        raise ClusterError(f"the local Ray came up on {', '.join(sorted(ips))}, not on 127.0.0.1; stopped it "
                           "(this Ray version ignores RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0: see flows/cluster.py)")
    _local_gcs = ray.get_runtime_context().gcs_address


def stop(actors: list, started: bool) -> None:
    """Kill the run's actors; disconnect if `start` connected (shutting down a local Ray)."""
    import ray
    for a in actors:
        ray.kill(a, no_restart=True)
    if started:
        ray.shutdown()


@contextmanager
def _loopback():
    """Ray's single-machine mode while ray.init starts the node: the variable for Ray's processes and for a
    later import of ray, the constant for a ray already imported. Both restored after: the processes started
    keep 127.0.0.1, and a later ray.init to a cluster in this process is not affected."""
    from ray._private import ray_constants
    saved_env, saved = os.environ.get(SINGLE_MACHINE), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[SINGLE_MACHINE] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved
        if saved_env is None:
            os.environ.pop(SINGLE_MACHINE, None)
        else:
            os.environ[SINGLE_MACHINE] = saved_env


def _is_loopback(ip: str) -> bool:
    a = ipaddress.ip_address(ip)
    return a.is_loopback or (a.version == 6 and a.ipv4_mapped is not None and a.ipv4_mapped.is_loopback)


# --- placement ----------------------------------------------------------------------------------------------


def actors_to_start(cpus: float, gpus: float, actors: int, log=None, fixed: bool | None = None) -> int:
    """Check, before any actor is requested, that an actor of `cpus` CPUs and `gpus` GPUs fits on one Ray node,
    and how many fit at once. -> the number of actors to request: `actors`, or on a fixed cluster (`fixed`;
    default: whether it is the local Ray `start_local` started) as many as fit at once. Raises ValueError when
    none can ever fit."""
    import ray
    log = log or run_logger()
    if fixed is None:  # the local Ray started here, and still the one connected (a test may have swapped it)
        fixed = bool(_local_gcs) and ray.is_initialized() and ray.get_runtime_context().gcs_address == _local_gcs
    need = {"CPU": cpus, "GPU": gpus}
    nodes = [_shape(n["Resources"]) for n in ray.nodes() if n.get("Alive")]
    groups = [] if fixed else _autoscaler_node_types()
    if not any(_fits(need, n) for n in nodes + groups):
        msg = _infeasible(need, nodes + groups)
        if fixed:
            raise ValueError(msg)
        if groups:
            raise ValueError(f"{msg} (counting the node types the autoscaler can add)")
        log.warning(f"{msg}, unless the autoscaler can add such a node: Ray does not say which node types it "
                    "can add, so the actors wait for one")
        return actors
    at_once = sum(_how_many(need, n) for n in nodes)
    if at_once >= actors:
        return actors
    if fixed:
        log.warning(f"--actors {actors}: only {at_once} fit on this Ray at once ({_describe(nodes)}); "
                    f"starting {at_once}")
        return at_once
    log.info(f"--actors {actors}: {at_once} fit on the cluster's live nodes at once; the others wait for free "
             "resources or for nodes the autoscaler adds")
    return actors


def run_logger():
    """The flow run's logger (console and Prefect UI) inside a flow; a plain one outside (tests, the API)."""
    from prefect import get_run_logger
    from prefect.exceptions import MissingContextError
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger("ssdgen.cluster")


def _shape(resources: dict) -> dict:
    return {"CPU": float(resources.get("CPU", 0)), "GPU": float(resources.get("GPU", 0))}


def _fits(need: dict, node: dict) -> bool:
    return all(node[k] + EPS >= v for k, v in need.items())


def _how_many(need: dict, node: dict) -> int:
    return min(math.floor((node[k] + EPS) / v) for k, v in need.items() if v > 0)


def _autoscaler_node_types() -> list[dict]:
    """The shapes of the nodes the autoscaler can add, where Ray publishes them (autoscaler v2 reports its
    cluster config to the GCS; Ray Data and Train read it the same way). [] when unknown."""
    try:
        from ray._private.state import state
        config = state.get_cluster_config()
    except Exception:  # noqa: BLE001 - a private API: unknown, not an error
        return []
    if config is None:
        return []
    return [_shape(dict(g.resources)) for g in config.node_group_configs if g.max_count != 0]


def _infeasible(need: dict, nodes: list[dict]) -> str:
    """One line: which flag asks for more than any node has, the largest node, what would fit."""
    cpus, gpus = need["CPU"], need["GPU"]
    max_gpus = max((n["GPU"] for n in nodes), default=0.0)
    with_gpus = [n for n in nodes if n["GPU"] + EPS >= gpus]
    if not with_gpus:  # no node has the GPUs: that is the flag to change
        largest = max(nodes, key=lambda n: (n["GPU"], n["CPU"]), default={"CPU": 0.0, "GPU": 0.0})
        fix = f"use --gpus-per-actor {_num(max_gpus)} or less" if max_gpus > 0 else \
            "use --gpus-per-actor 0 and a CPU --device-type"
        return f"--gpus-per-actor {_num(gpus)}: no Ray node has {_count(gpus, 'GPU')} " \
               f"(largest: {_describe([largest])}); {fix}"
    largest = max(with_gpus, key=lambda n: n["CPU"])
    flag = f"--cpus-per-actor {_num(cpus)}" + (f" --gpus-per-actor {_num(gpus)}" if gpus > 0 else "")
    has = _count(cpus, "CPU") + (f" and {_count(gpus, 'GPU')}" if gpus > 0 else "")
    fix = f"use --cpus-per-actor {_num(largest['CPU'])} or less" if largest["CPU"] > 0 else \
        "no node with those GPUs has a CPU to give"
    return f"{flag}: no Ray node has {has} (largest: {_describe([largest])}); {fix}"


def _describe(nodes: list[dict]) -> str:
    shapes = sorted({(n["CPU"], n["GPU"]) for n in nodes}, reverse=True)
    if not shapes:
        return "no nodes"
    text = "; ".join(f"{_count(c, 'CPU')}, {_count(g, 'GPU')}" for c, g in shapes[:3])
    return text + (f"; {len(shapes) - 3} more node shapes" if len(shapes) > 3 else "")


def _count(x: float, unit: str) -> str:
    return f"{_num(x)} {unit}{'' if x == 1 else 's'}"


def _num(x: float) -> str:
    return f"{x:g}"
