"""A CPU tier that catches tensors created off the model's device.

Each decoder runs on a CPU model inside `stray_device_trap()`: "meta" is the default device there, so any
tensor created without an explicit device (torch.zeros(...), torch.arange(...), torch.tensor(...), a module
built without one) lands on "meta" instead of the model's device. On a GPU the same line would put a
buffer on the CPU next to CUDA tensors; here it fails at once, on a CPU-only machine.

Mixing meta and CPU tensors does not always raise by itself: indexing a CPU tensor with a meta index, or
scattering a meta index into it, returns uninitialised memory without an error (torch 2.13). So the trap
also installs `_NoMeta`, a dispatch mode that raises on any operator that reads or returns a meta tensor,
naming the operator; the stack trace points at the line. Each run's tokens are also compared with the same
run outside the trap: the trap must change nothing on the model's device.

The decoders' random numbers are tensors too (counter-based, decoders/sampling.py: keys and uniforms made on the
model's device), so the trap covers them; no torch.Generator is left in the decoding path.
"""

import contextlib
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

from ssdgen.decoders import decode, load_heads  # noqa: E402
from ssdgen.decoders.fidelity import target_nll  # noqa: E402
from ssdgen.decoders.recipes import SamplingConfig  # noqa: E402
from ssdgen.decoders.ssd_train import DistillConfig, draft_acceptance, train_heads  # noqa: E402
from test_decoders import PROMPTS  # noqa: E402
from tiny import tiny_with_heads  # noqa: E402

SAMPLED = SamplingConfig(cfg_scale=3.0)
FILTERED = SamplingConfig(cfg_scale=2.0, temperature=0.9, top_k=5, top_p=0.9)  # every processing step


class _NoMeta(TorchDispatchMode):
    """Raise on any operator with a meta tensor among its inputs or outputs."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(isinstance(t, torch.Tensor) and t.is_meta for t in tree_leaves((args, kwargs))):
            raise RuntimeError(f"stray device: {func} got a meta tensor (created without device=)")
        out = func(*args, **kwargs)
        if any(isinstance(t, torch.Tensor) and t.is_meta for t in tree_leaves(out)):
            raise RuntimeError(f"stray device: {func} made a meta tensor (created without device=)")
        return out


@contextlib.contextmanager
def stray_device_trap():
    with torch.device("meta"), _NoMeta():
        yield


def test_the_trap_catches_a_stray_tensor():
    x = torch.ones(3)
    with stray_device_trap():
        torch.zeros(3, device=x.device).add_(x)  # explicit device: fine
        with pytest.raises(RuntimeError, match="stray device"):
            x[torch.arange(2)]  # without the dispatch mode this returns garbage, silently
        with pytest.raises(RuntimeError, match="stray device"):
            torch.zeros(3)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_with_heads(tmp_path_factory.mktemp("tiny"))


def _same(a, b) -> bool:
    """Same tokens and the same per-sample statistics (forwards, tokens per forward, commit map)."""
    def stats(res):
        return [(s.forwards, s.tokens_per_forward_hist, s.commit_map.tolist()) for s in res.stats]
    return torch.equal(a.tokens, b.tokens) and stats(a) == stats(b)


DECODERS = [
    ("ar", {}), ("sjd", {"window": 6}), ("sjd", {"window": 6, "init": "repeat-above", "coupled": True}),
    ("csd", {"window": 6}), ("ssd", {"rows": 2, "rounds": 1, "commit": "block"}),
    ("ssd", {"lossless": True, "rows": 2}),
    ("ssd", {"commit": "prefix", "rows": 1}), ("ssd+csd", {"calibrated": False}),
    ("ssd+csd", {"commit": "prefix", "adaptive": False, "calibrated": False, "lam": 1.0, "delta": 0.3}),
]


@pytest.mark.parametrize("sc", [SAMPLED, FILTERED], ids=["cfg", "filtered"])
@pytest.mark.parametrize("name, params", DECODERS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(DECODERS)])
def test_decoders_create_nothing_off_the_model_device(tiny, name, params, sc):
    prompts, seeds = PROMPTS * 2, list(range(8))
    with stray_device_trap():  # an SSD decoder loads its heads inside the trap too
        trapped = decode(name, tiny, prompts, seeds, sc, params)
    assert trapped.tokens.device == tiny.device
    assert all(p.device == tiny.device for p in load_heads(tiny).parameters())
    assert _same(trapped, decode(name, tiny, prompts, seeds, sc, params))


def test_calibrated_ssd_csd_measures_its_cost_curve_on_the_device(tiny):
    """The default ssd+csd resolves first (calibrate.py: the cost curve, then timed decodes): its tokens depend
    on the spec that timing chose, so no comparison."""
    from ssdgen.decoders import DecodeSpec, resolve, run
    with stray_device_trap():
        spec, measured = resolve(DecodeSpec.of("ssd+csd", None, SAMPLED), tiny, PROMPTS, [0, 1, 2, 3], 4)
        res = run(spec, tiny, PROMPTS, [0, 1, 2, 3])
    assert res.tokens.shape == (4, 16) and measured.batch == 4 and not spec.calibrated


@pytest.mark.parametrize("kind", ["latent", "token"])
def test_heads_training_step_creates_nothing_off_the_model_device(tiny, kind):
    dc = DistillConfig(n_images=4, sample_batch=2, steps=2, batch=32, kind=kind)
    with stray_device_trap():
        heads, info = train_heads(tiny, PROMPTS, SAMPLED, dc, log=lambda *a: None)
        acc = draft_acceptance(tiny, heads, PROMPTS[:2], [0, 1], SAMPLED)
    assert all(p.device == tiny.device for p in heads.parameters())
    again, _ = train_heads(tiny, PROMPTS, SAMPLED, dc, log=lambda *a: None)
    for (k, a), b in zip(heads.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), k
    assert 0 < acc["vertical"] <= 1


def test_target_nll_creates_nothing_off_the_model_device(tiny):
    tokens = decode("ar", tiny, PROMPTS, [0, 1, 2, 3], SAMPLED).tokens
    with stray_device_trap():
        nll = target_nll(tiny, PROMPTS, tokens, FILTERED, chunk=5)
    assert torch.equal(nll, target_nll(tiny, PROMPTS, tokens, FILTERED, chunk=5))


# ------------------------------------------------------------------ Hugging Face adapters

@pytest.fixture(scope="module", params=["janus", "emu3", "chameleon"])
def adapter(request):
    from test_hf_adapters import BUILDERS
    torch.manual_seed(0)
    return BUILDERS[request.param]()


@pytest.mark.parametrize("name, params", [("ar", {}), ("sjd", {"window": 5}),
                                          ("sjd", {"window": 5, "coupled": True, "init": "repeat-left"})])
def test_adapters_create_nothing_off_the_model_device(adapter, name, params):
    from test_hf_adapters import PROMPTS as HF_PROMPTS
    seeds = [1, 2, 3, 4]
    with stray_device_trap():
        trapped = decode(name, adapter, HF_PROMPTS, seeds, SAMPLED, params)
    assert torch.equal(trapped.tokens, decode(name, adapter, HF_PROMPTS, seeds, SAMPLED, params).tokens)


def test_adapters_ssd_creates_nothing_off_the_model_device(adapter):
    """SSD through an adapter, with random heads (the adapters have no default heads)."""
    from test_hf_adapters import PROMPTS as HF_PROMPTS
    from ssdgen.decoders.drafters import HeadsConfig, SpatialHeads
    torch.manual_seed(1)
    heads = SpatialHeads(HeadsConfig(dim=adapter.hidden_dim, emb_dim=adapter.hidden_dim, n_codes=adapter.n_codes,
                                     grid=adapter.grid, model=adapter.name)).eval()
    for params in ({"rows": 1, "rounds": 1, "commit": "block"}, {"rows": 1, "lossless": True}):
        with stray_device_trap():
            trapped = decode("ssd", adapter, HF_PROMPTS[:2], [3, 4], SAMPLED, params, heads=heads)
        assert torch.equal(trapped.tokens, decode("ssd", adapter, HF_PROMPTS[:2], [3, 4], SAMPLED, params,
                                                  heads=heads).tokens)
