"""flows/cluster.py against a real local Ray with fixed resources (the `local_ray` fixture: 2 CPUs, no GPU,
started by flows.cluster.start_local): the Ray is on loopback, and an actor that fits no node is refused in one
line before any actor is requested, while a pool larger than the machine is cut to what fits."""

import pytest

from ssdgen.flows import cluster


class Lines:
    """A logger that keeps what it is told."""

    def __init__(self):
        self.lines = []

    def info(self, msg):
        self.lines.append(("info", msg))

    def warning(self, msg):
        self.lines.append(("warning", msg))


def test_the_local_ray_is_on_loopback_and_counts_as_fixed(local_ray):
    assert {n["NodeManagerAddress"] for n in local_ray.nodes()} == {"127.0.0.1"}
    assert cluster.actors_to_start(1, 0, 2, Lines()) == 2  # fits: nothing said, nothing cut


@pytest.mark.parametrize("cpus, gpus, message", [
    (4, 0, "--cpus-per-actor 4: no Ray node has 4 CPUs (largest: 2 CPUs, 0 GPUs); use --cpus-per-actor 2 or less"),
    (2.5, 0, "--cpus-per-actor 2.5: no Ray node has 2.5 CPUs (largest: 2 CPUs, 0 GPUs); use --cpus-per-actor 2 "
             "or less"),
    (1, 1, "--gpus-per-actor 1: no Ray node has 1 GPU (largest: 2 CPUs, 0 GPUs); use --gpus-per-actor 0 and a "
           "CPU --device-type"),
])
def test_an_actor_larger_than_any_node_is_one_line_before_any_actor(local_ray, cpus, gpus, message):
    with pytest.raises(ValueError) as e:
        cluster.actors_to_start(cpus, gpus, 1, Lines())
    assert str(e.value) == message
    assert "\n" not in str(e.value)


def test_a_pool_larger_than_the_machine_is_cut_to_what_fits_and_said(local_ray):
    log = Lines()
    assert cluster.actors_to_start(1, 0, 5, log) == 2
    assert cluster.actors_to_start(0.5, 0, 5, log) == 4
    assert cluster.actors_to_start(0.5, 0, 4, log) == 4
    assert log.lines == [("warning", "--actors 5: only 2 fit on this Ray at once (2 CPUs, 0 GPUs); starting 2"),
                         ("warning", "--actors 5: only 4 fit on this Ray at once (2 CPUs, 0 GPUs); starting 4")]


def test_on_a_cluster_that_may_grow_it_warns_and_waits_instead(local_ray):
    """Ray 2.60 does not publish the node types an autoscaler can add: a cluster's infeasible actor may still
    get a node (a GPU group scaled to zero), so it is a warning and the pool is requested whole."""
    log = Lines()
    assert cluster.actors_to_start(4, 0, 3, log, fixed=False) == 3
    ((level, line),) = log.lines
    assert level == "warning" and line.startswith("--cpus-per-actor 4: no Ray node has 4 CPUs (largest: 2 CPUs")
    assert "unless the autoscaler can add such a node" in line
    log.lines.clear()
    assert cluster.actors_to_start(1, 0, 3, log, fixed=False) == 3
    assert log.lines == [("info", "--actors 3: 2 fit on the cluster's live nodes at once; the others wait for "
                                  "free resources or for nodes the autoscaler adds")]


def test_the_message_for_a_gpu_node_that_is_too_small():
    """The shipped nightly deployment's old mistake on the KubeRay nodes: 4 CPUs asked, a GPU pod gives 3."""
    nodes = [{"CPU": 0.0, "GPU": 0.0}, {"CPU": 3.0, "GPU": 1.0}, {"CPU": 8.0, "GPU": 0.0}]
    assert cluster._infeasible({"CPU": 4.0, "GPU": 1.0}, nodes) == (
        "--cpus-per-actor 4 --gpus-per-actor 1: no Ray node has 4 CPUs and 1 GPU (largest: 3 CPUs, 1 GPU); "
        "use --cpus-per-actor 3 or less")
    assert cluster._infeasible({"CPU": 1.0, "GPU": 2.0}, nodes) == (
        "--gpus-per-actor 2: no Ray node has 2 GPUs (largest: 3 CPUs, 1 GPU); use --gpus-per-actor 1 or less")


@pytest.mark.integration
def test_starting_the_local_ray_keeps_the_runs_sigterm_handler(tmp_path):
    """Ray's init installs a SIGTERM handler raising SystemExit wherever the main thread is; a signal in that
    moment could be swallowed and the run went on. cluster.start keeps the caller's handler (a fresh process:
    the local_ray fixture's Ray is already up in this one)."""
    import subprocess
    import sys
    code = ("import signal\n"
            "from ssdgen.flows import cluster\n"
            "def mine(signum, frame): pass\n"
            "signal.signal(signal.SIGTERM, mine)\n"
            "assert cluster.start()\n"
            "kept = signal.getsignal(signal.SIGTERM) is mine\n"
            "cluster.stop([], True)\n"
            "print('kept' if kept else 'replaced')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "kept"
