"""The op `ssdgen::decode_attention` (reference/decode_attention.py, .c): its output against SDPA for 1 to 16
queries per row under every kind of mask the model builds, over fp32 and bf16 caches; the checks that refuse a bad
call before the C kernel can read out of bounds; its registration (opcheck, torch.compile's tracing); and its build,
made once per machine and loaded from the cache after (reference/native_build.py).

Outputs are compared with a float tolerance against SDPA in float64 over the same (upcast) caches: the kernel and
SDPA sum in different orders, and the kernel's exp is a polynomial within 2 ulp."""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from ssdgen.reference import decode_attention as da
from ssdgen.reference import native_build
from ssdgen.reference.gpt import tree_mask

needs_op = pytest.mark.skipif(da.library() is None, reason="no C compiler here: attention falls back to SDPA")


def _qkv(B, H, S, D, talloc, dtype, q_dtype=torch.float32, seed=0):
    """q [B, H, S, D] strided as the model's permuted view is; caches [B, H, talloc, D] in dtype."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, S, 3, H, D, generator=g)[:, :, 0].transpose(1, 2).to(q_dtype)
    k, v = torch.randn(2, B, H, talloc, D, generator=g).to(dtype).unbind(0)
    return q, k, v


def _window_mask(B, S, T, seed=0):
    """Causal windows ending at each row's own position (rows of different valid lengths), as gpt.py builds."""
    g = torch.Generator().manual_seed(seed)
    last = torch.randint(S - 1, T, (B, 1), generator=g)
    pos = last - S + 1 + torch.arange(S)[None]  # [B, S]
    return (torch.arange(int(pos.max()) + 1)[None, None, :] <= pos[:, :, None]).unsqueeze(1)


def _tree(B, S, T, seed=0):
    """gpt.tree_mask over random trees (each entry sees itself and a random set of earlier entries)."""
    g = torch.Generator().manual_seed(seed)
    tree = torch.rand(B, S, S, generator=g) < 0.5
    tree = tree.tril() | torch.eye(S, dtype=torch.bool)
    root = torch.randint(1, T - S + 1, (B, 1), generator=g)
    return tree_mask(root.expand(B, S).contiguous(), tree)[1]


def _random_mask(B, S, T, seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(B, 1, S, T, generator=g) < 0.3
    mask[..., 0] = True  # every query sees a slot: SDPA gives NaN for one that sees none
    return mask


MASKS = {"window": _window_mask, "tree": _tree, "random": _random_mask}


def _reference(q, k, v, mask):
    """SDPA in float64 over the caches as stored -> [B, S, H, D]."""
    T = mask.shape[-1]
    return F.scaled_dot_product_attention(q.double(), k[:, :, :T].double(), v[:, :, :T].double(),
                                          attn_mask=mask).transpose(1, 2)


@needs_op
@pytest.mark.parametrize("S", [1, 2, 4, 8, 9, 16])
@pytest.mark.parametrize("kind", sorted(MASKS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B,H,D", [(1, 1, 32), (3, 8, 32), (5, 2, 64), (2, 3, 24)])
def test_the_op_equals_sdpa(S, kind, dtype, B, H, D):
    T = 70
    mask = MASKS[kind](B, S, T, seed=S)
    q, k, v = _qkv(B, H, S, D, T + 9, dtype, seed=S)
    out = torch.ops.ssdgen.decode_attention(q, k, v, mask)
    assert out.shape == (B, S, H, D) and out.dtype == q.dtype
    torch.testing.assert_close(out.double(), _reference(q, k, v, mask), atol=1e-5, rtol=1e-5)


@needs_op
@pytest.mark.parametrize("S", [1, 4, 8, 16])
def test_a_bf16_cache_matches_what_the_model_ran_before(S):
    """With a bf16 cache the model ran SDPA in bf16 (q cast to the cache's dtype); the op reads q in fp32 and sums
    in fp32: the same up to bf16's rounding. A bf16 q (a bf16 model) gives a bf16 output."""
    mask = _window_mask(4, S, 120)
    q, k, v = _qkv(4, 8, S, 32, 140, torch.bfloat16)
    T = mask.shape[-1]
    before = F.scaled_dot_product_attention(q.bfloat16(), k[:, :, :T], v[:, :, :T], attn_mask=mask).transpose(1, 2)
    torch.testing.assert_close(da.attention(q, k, v, mask), before.float(), atol=2e-2, rtol=2e-2)
    out = da.attention(q.bfloat16(), k, v, mask)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, before, atol=2e-2, rtol=2e-2)


@needs_op
def test_a_row_is_its_own_whatever_its_batch_mates_and_the_threads():
    """Bit for bit: a row alone with a mask only as wide as its own last attended slot, in a batch whose other
    rows reach further, and on one thread."""
    q, k, v = _qkv(6, 8, 5, 32, 90, torch.float32, seed=3)
    mask = _random_mask(6, 5, 80, seed=3)
    mask[2, ..., 50:] = False
    full = da.attention(q, k, v, mask)
    assert torch.equal(full[2:3], da.attention(q[2:3], k[2:3], v[2:3], mask[2:3, ..., :50]))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(da.attention(q, k, v, mask), full)
    finally:
        torch.set_num_threads(threads)


@needs_op
def test_a_query_with_every_slot_masked_gives_zeros():
    q, k, v = _qkv(2, 2, 4, 32, 20, torch.float32)
    mask = _window_mask(2, 4, 16)
    mask[1, :, 2] = False
    out = da.attention(q, k, v, mask)
    assert torch.equal(out[1, 2], torch.zeros_like(out[1, 2])) and out[1, 1].abs().sum() > 0


def _bad_calls():
    """(name, q, k, v, mask) for each way a call can be wrong."""
    q, k, v = _qkv(2, 4, 3, 32, 20, torch.float32)
    mask = _window_mask(2, 3, 16)
    kb, vb = k.bfloat16(), v.bfloat16()
    return {
        "v's dtype is not k's": (q, k, vb, mask),
        "a float64 cache": (q.double(), k.double(), v.double(), mask),
        "q in a third dtype": (q.half(), kb, vb, mask),
        "the caches' batch is not q's": (q, k[:1], v[:1], mask),
        "the caches' heads are not q's": (q, k[:, :2], v[:, :2], mask),
        "the head size is not q's": (q, k[..., :16], v[..., :16], mask),
        "k and v of different lengths": (q, k, v[:, :, :18], mask),
        "the mask wider than the cache": (q, k, v, torch.ones(2, 1, 3, 21, dtype=torch.bool)),
        "an empty mask": (q, k, v, mask[..., :0]),
        "more than 16 queries": (*_qkv(2, 4, 17, 32, 20, torch.float32)[:1], k, v, _window_mask(2, 17, 18)),
        "the mask's batch is not q's": (q, k, v, mask[:1]),
        "a mask per head": (q, k, v, mask.expand(2, 4, 3, mask.shape[-1])),
        "the mask's queries are not q's": (q, k, v, mask[:, :, :2]),
        "an additive mask": (q, k, v, mask.float()),
        "a non-contiguous cache": (q, k[:, :, ::2], v[:, :, ::2], mask[..., :10]),
        "q strided in its last dimension": (q.transpose(2, 3).contiguous().transpose(2, 3)[..., :32], k, v, mask),
        "a 3-dimensional q": (q[0], k, v, mask),
        "on the meta device": (q.to("meta"), k.to("meta"), v.to("meta"), mask.to("meta")),
    }


@needs_op
@pytest.mark.parametrize("name", sorted(_bad_calls()))
def test_a_bad_call_raises_before_the_kernel_reads(name, monkeypatch):
    """Every bad call raises ValueError in Python; the C kernel (replaced here by a sentinel) is never reached."""
    reached = []
    monkeypatch.setattr(da, "_built", native_build.Built(
        type("Lib", (), {"decode_attention": staticmethod(lambda *a: reached.append(a) or 0)})(), None, False))
    q, k, v, mask = _bad_calls()[name]
    if name == "q strided in its last dimension":
        assert q.stride(3) != 1
    with pytest.raises(ValueError, match="ssdgen::decode_attention"):
        torch.ops.ssdgen.decode_attention(q, k, v, mask)
    assert not reached


@needs_op
def test_attention_routes_what_the_op_does_not_take_to_sdpa():
    """None (the caller runs SDPA) for what the op does not cover by design; a bad call of a covered kind raises."""
    q, k, v = _qkv(2, 2, 4, 32, 20, torch.float32)
    mask = _window_mask(2, 4, 16)
    assert da.attention(q, k, v, mask) is not None and da.attention(q, k.bfloat16(), v.bfloat16(), mask) is not None
    assert da.attention(q.double(), k.double(), v.double(), mask) is None  # float64 (the golden tests' model)
    assert da.attention(*_qkv(2, 2, 17, 32, 20, torch.float32), _window_mask(2, 17, 18)) is None  # a prefill
    assert da.attention(q.to("meta"), k.to("meta"), v.to("meta"), mask.to("meta")) is None
    with pytest.raises(ValueError):
        da.attention(q, k, v.bfloat16(), mask)


@needs_op
@pytest.mark.parametrize("S,dtype", [(1, torch.float32), (4, torch.float32), (8, torch.bfloat16)])
def test_the_op_passes_torch_library_opcheck(S, dtype):
    """Schema, fake (meta) implementation, autograd registration and AOT dispatch, as torch checks a custom op."""
    q, k, v = _qkv(2, 4, S, 32, 30, dtype)
    torch.library.opcheck(torch.ops.ssdgen.decode_attention.default, (q, k, v, _window_mask(2, S, 24)))


@needs_op
def test_the_op_traces_under_torch_compile():
    """torch.compile traces the op through its fake implementation (fullgraph: no graph break) and runs it."""
    q, k, v = _qkv(2, 4, 4, 32, 30, torch.float32)
    mask = _window_mask(2, 4, 24)

    def step(q, k, v, mask):
        return torch.ops.ssdgen.decode_attention(q, k, v, mask).flatten(2) * 2

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v, mask), step(q, k, v, mask))


@needs_op
def test_a_fresh_process_loads_the_cached_build_without_compiling():
    """This process built or loaded the op; a new one finds the same file and loads it, compiling nothing."""
    path = da._built.path
    before = path.stat().st_mtime_ns
    out = subprocess.run([sys.executable, "-c", "from ssdgen.reference import decode_attention as da; "
                          "print(da.state(), da._built.path)"], capture_output=True, text=True, timeout=300,
                         env=os.environ.copy())
    assert out.stdout.split() == ["loaded", str(path)], out.stderr
    assert path.stat().st_mtime_ns == before and path.parent == native_build.cache_dir()


PROBE = "int answer(void) { return 42; }\n"


def _probe_package(root, source: str = PROBE) -> str:
    """A package holding one tiny C source, so the build's cache is tested without the op's longer build -> its
    name (one per test: a process imports a package once)."""
    name = f"probe_ops_{root.name}"
    (root / name).mkdir()
    (root / name / "__init__.py").write_text("")
    (root / name / "probe.c").write_text(source)
    return name


def test_a_build_is_made_once_per_machine_and_loaded_after(tmp_path):
    """The first process compiles into the cache; a second, fresh one loads that file, compiling nothing."""
    package = _probe_package(tmp_path)
    env = os.environ | {"SSDGEN_OPS_DIR": str(tmp_path / "ops"),
                        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    code = ("from ssdgen.reference import native_build as nb; b = nb.load('probe.c', '" + package + "'); "
            "print(b.compiled, b.lib.answer(), b.path)")

    def fresh_process() -> list[str]:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()
    first = fresh_process()
    mtime = os.stat(first[2]).st_mtime_ns
    second = fresh_process()
    assert first[:2] == ["True", "42"] and second == ["False", "42", first[2]]
    assert os.stat(first[2]).st_mtime_ns == mtime
    assert [p.name for p in (tmp_path / "ops").iterdir()] == [os.path.basename(first[2])]  # no temporary left


def test_an_unwritable_cache_builds_in_a_temporary_folder(tmp_path, monkeypatch, caplog):
    package = _probe_package(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("SSDGEN_OPS_DIR", str(tmp_path / "file" / "ops"))  # under a file: never a folder
    with caplog.at_level("WARNING", logger=native_build.__name__):
        built = native_build.load("probe.c", package)
    assert built.compiled and built.lib.answer() == 42 and not built.path.exists()
    assert "cannot be written" in caplog.text


def test_a_failed_build_raises_and_leaves_nothing(tmp_path, monkeypatch):
    package = _probe_package(tmp_path, "this is not C\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("SSDGEN_OPS_DIR", str(tmp_path / "ops"))
    with pytest.raises(native_build.BuildError, match="did not build probe.c"):
        native_build.load("probe.c", package)
    assert list((tmp_path / "ops").iterdir()) == []


def test_the_build_key_follows_source_compiler_flags_and_cpu():
    base = native_build.key(b"src", ["cc"], "gcc 12", ("-O3",), "cpu A")
    assert base == native_build.key(b"src", ["cc"], "gcc 12", ("-O3",), "cpu A")
    assert len({base, native_build.key(b"src2", ["cc"], "gcc 12", ("-O3",), "cpu A"),
                native_build.key(b"src", ["clang"], "gcc 12", ("-O3",), "cpu A"),
                native_build.key(b"src", ["cc"], "gcc 13", ("-O3",), "cpu A"),
                native_build.key(b"src", ["cc"], "gcc 12", ("-O2",), "cpu A"),
                native_build.key(b"src", ["cc"], "gcc 12", ("-O3",), "cpu B")}) == 6
    if os.path.exists("/proc/cpuinfo"):  # -march=native's CPU: its model and its feature flags
        assert "model name" in native_build.cpu() or "Features" in native_build.cpu()


def test_the_plan_cache_keys_on_the_attention_that_ran():
    """A profile measured with the op is not replayed where steps run SDPA, nor the other way
    (workers/plan_cache.py)."""
    from types import SimpleNamespace

    from ssdgen.decoders.protocol import Capabilities
    from ssdgen.workers import plan_cache

    def model(attention):
        caps = Capabilities(weights_digest="d", kv_dtype="float32", attention=attention)
        return SimpleNamespace(name="m", device="cpu", dtype="float32", capabilities=caps)
    assert len({plan_cache.key(model(a), "ar", 64, threads=2) for a in ("op", "sdpa", None)}) == 3
