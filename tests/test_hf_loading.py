"""Loading a Hugging Face checkpoint through an adapter: where the special-token ids come from.

`JanusAdapter.from_pretrained` takes the image-start (BOI) id from the arguments, else the checkpoint's generation
config, else the tokenizer's `boi_token`. The fallbacks are lazy: a tokenizer without `boi_token` must not break
loading when the generation config already gives the id (it used to raise AttributeError), and without any
source the error says what to pass. Weights load from safetensors only (a folder of pickled `.bin` weights is
refused, naming the folder), in the dtype asked for. Checkpoints are the tiny random Janus of test_hf_adapters,
saved offline.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import ssdgen.models.hf as hf  # noqa: E402
from ssdgen.decoders import decode  # noqa: E402
from ssdgen.decoders.recipes import SamplingConfig  # noqa: E402
from test_hf_adapters import PROMPTS, WORDS, tiny_janus  # noqa: E402


class _Tokenizer:
    """What from_pretrained needs of a tokenizer (encode, pad_token_id), and optionally a boi_token."""

    def __init__(self, pad_token_id: int, boi: tuple[str, int] | None = None):
        self.pad_token_id = pad_token_id
        if boi is not None:
            self.boi_token, self._boi_id = boi

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return WORDS(text)

    def convert_tokens_to_ids(self, token: str) -> int:
        assert token == self.boi_token
        return self._boi_id


@pytest.fixture(scope="module")
def janus_dir(tmp_path_factory):
    torch.manual_seed(0)
    a = tiny_janus()
    path = tmp_path_factory.mktemp("janus")
    a.model.save_pretrained(path)  # its generation config has a pad id (0) but no BOI id
    return a, path


def _with_boi_in_generation_config(src, dst, boi_id: int):
    from transformers import GenerationConfig
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    # (set through the constructor: an attribute set afterwards is not saved)
    GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0,
                     generation_kwargs={"boi_token_id": boi_id}).save_pretrained(dst)
    return dst


def test_first_does_not_evaluate_fallbacks_after_a_hit():
    def boom():
        raise AttributeError("evaluated")
    assert hf._first(None, 7, boom) == 7
    assert hf._first(None, lambda: None, lambda: 3, boom) == 3
    assert hf._first(None, lambda: None) is None


def test_tokenizer_without_boi_token_loads_when_the_generation_config_has_it(janus_dir, tmp_path, monkeypatch):
    a, src = janus_dir
    path = _with_boi_in_generation_config(src, tmp_path, a.boi_id)
    monkeypatch.setattr(hf, "_tokenizer", lambda p: _Tokenizer(pad_token_id=a.pad_id))  # no boi_token attribute
    b = hf.JanusAdapter.from_pretrained(path, dtype=torch.float32, pad_id=a.pad_id, template="{prompt}")
    assert (b.boi_id, b.pad_id) == (a.boi_id, a.pad_id)
    sc = SamplingConfig(temperature=0, cfg_scale=3.0)
    assert torch.equal(decode("ar", a, PROMPTS[:1], [0], sc).tokens, decode("ar", b, PROMPTS[:1], [0], sc).tokens)


def test_tokenizer_boi_token_is_the_last_fallback(janus_dir, monkeypatch):
    a, src = janus_dir
    monkeypatch.setattr(hf, "_tokenizer", lambda p: _Tokenizer(a.pad_id, ("<begin_of_image>", a.boi_id)))
    b = hf.JanusAdapter.from_pretrained(src, dtype=torch.float32)
    assert b.boi_id == a.boi_id
    assert b.pad_id == 0  # the generation config's pad id comes before the tokenizer's


def test_no_boi_anywhere_names_what_to_pass(janus_dir, monkeypatch):
    a, src = janus_dir
    monkeypatch.setattr(hf, "_tokenizer", lambda p: _Tokenizer(pad_token_id=a.pad_id))
    with pytest.raises(ValueError, match="pass boi_id="):
        hf.JanusAdapter.from_pretrained(src, dtype=torch.float32)


# ------------------------------------------------------------------ safetensors only, device and dtype

def test_a_folder_of_pickled_weights_is_refused_naming_it(janus_dir, tmp_path, monkeypatch):
    a, src = janus_dir
    (tmp_path / "config.json").write_bytes((src / "config.json").read_bytes())
    torch.save(a.model.state_dict(), tmp_path / "pytorch_model.bin")  # what an old checkpoint holds
    monkeypatch.setattr(hf, "_tokenizer", lambda p: _Tokenizer(a.pad_id, ("<begin_of_image>", a.boi_id)))
    with pytest.raises(ValueError, match="holds only pickled weights") as e:
        hf.load_model(f"janus:{tmp_path}")
    assert str(tmp_path) in str(e.value) and "safetensors" in str(e.value) and "\n" not in str(e.value)


def test_a_folder_without_weights_or_a_missing_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no .safetensors weights"):
        hf.load_model(f"emu3:{tmp_path}")
    with pytest.raises(FileNotFoundError, match="no such checkpoint folder"):
        hf.load_model(f"chameleon:{tmp_path / 'nowhere'}")


def test_the_registry_loads_a_checkpoint_in_the_dtype_asked_for(janus_dir, monkeypatch):
    from ssdgen.models.registry import load_model
    a, src = janus_dir
    assert any(f.suffix == ".safetensors" for f in src.iterdir())
    monkeypatch.setattr(hf, "_tokenizer", lambda p: _Tokenizer(a.pad_id, ("<begin_of_image>", a.boi_id)))
    auto = load_model(f"janus:{src}", device="cpu")  # auto: fp32 on the CPU
    assert auto.dtype == torch.float32 and auto.device == torch.device("cpu")
    assert load_model(f"janus:{src}", dtype="bf16").dtype == torch.bfloat16
    with pytest.raises(ValueError, match="fp16 is not supported on the CPU"):
        load_model(f"janus:{src}", dtype="fp16")
