"""The up-front checks of the model's checkpoint and the SSD heads (models/checkpoints.py, through
`check_model_spec`): what each loader opens must be there, or one line names the path and the spec."""

import pytest

from ssdgen.decoders.spec import DecodeSpec
from ssdgen.models.checkpoints import BUNDLE_FILES, PICKLED, default_bundle
from ssdgen.models.registry import check_model_spec


def fails(exc, *words, model, decoder=None):
    with pytest.raises(exc) as e:
        check_model_spec(model, None if decoder is None else DecodeSpec.parse(decoder))
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg
    return msg


def test_the_lists_match_what_the_loaders_open():
    from ssdgen.models.hf import PICKLED as HF_PICKLED
    from ssdgen.reference.weights import DEFAULT_DIR, FILES
    assert set(BUNDLE_FILES) == set(FILES) | {"checksums.json"} and PICKLED == HF_PICKLED
    assert default_bundle() == DEFAULT_DIR


def test_reference_bundles(tmp_path):
    check_model_spec("reference", DecodeSpec.parse("ssd+csd"))  # the bundled model and its own heads
    check_model_spec(None)
    fails(FileNotFoundError, "reference:/nonexistent", "not a model bundle", model="reference:/nonexistent")
    (tmp_path / "checksums.json").write_text("{}")
    (tmp_path / "config.json").write_text("{}")
    fails(FileNotFoundError, str(tmp_path), "vq.safetensors, gpt.safetensors", model=f"reference:{tmp_path}")
    fails(ValueError, "is a file", model=f"reference:{tmp_path / 'config.json'}")


def test_hugging_face_folders(tmp_path):
    msg = fails(FileNotFoundError, "janus:/nonexistent", "no such checkpoint folder", model="janus:/nonexistent")
    assert msg == "model 'janus:/nonexistent': /nonexistent: no such checkpoint folder"
    fails(FileNotFoundError, "no config.json", model=f"emu3:{tmp_path}:grid=4x4")
    (tmp_path / "config.json").write_text("{}")
    fails(FileNotFoundError, "no .safetensors weights", model=f"janus:{tmp_path}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    fails(ValueError, "only pickled weights", "pytorch_model.bin", model=f"chameleon:{tmp_path}")
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"")  # a sharded checkpoint passes
    check_model_spec(f"janus:{tmp_path}")
    fails(ValueError, "s3://b/ckpt", "local folder", model="janus:s3://b/ckpt")


def test_heads_paths(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    (ckpt / "model.safetensors").write_bytes(b"")
    janus = f"janus:{ckpt}"
    check_model_spec(janus, DecodeSpec.parse("csd"))  # no heads needed
    fails(ValueError, "no default SSD heads", "heads=PATH", model=janus, decoder="ssd")
    fails(FileNotFoundError, f"ssd:heads={tmp_path}/h", "h.json and h.safetensors", model=janus,
          decoder=f"ssd:heads={tmp_path}/h")
    (tmp_path / "h.json").write_text("{}")
    (tmp_path / "h.safetensors").write_bytes(b"")
    check_model_spec(janus, DecodeSpec.parse(f"ssd+csd:heads={tmp_path}/h"))
    check_model_spec(janus, DecodeSpec.parse(f"ssd:heads={tmp_path}/h.safetensors"))  # as SpatialHeads.load
    fails(FileNotFoundError, "no SSD heads at", model="reference", decoder="ssd:heads=/nonexistent/heads")
