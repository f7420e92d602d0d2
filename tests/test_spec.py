"""The one typed decode spec: parsed once from text, canonical, round-trips through its dict (how it
reaches the actors), and every decoder parameter and sampling setting is reachable from it."""

from dataclasses import fields

import pytest

from decoders import FAMILIES, run
from decoders.sampling import SamplingConfig
from decoders.spec import DecodeSpec, common_sampling


def test_parse_canonical_text_and_round_trips():
    s = DecodeSpec.parse("ssd+csd:token_budget=0:rows=2:calibrated=false:cfg=2:top_k=50")
    assert s.family == "ssd+csd" and dict(s.params) == {"calibrated": False, "rows": 2, "token_budget": 0}
    assert s.sampling == SamplingConfig(cfg_scale=2.0, top_k=50)
    assert str(s) == "ssd+csd:calibrated=false:rows=2:token_budget=0:cfg=2.0:temperature=1.0:top_k=50:top_p=1.0"
    assert DecodeSpec.parse(str(s)) == s == DecodeSpec.from_dict(s.to_dict())
    assert s.label == "ssd+csd:calibrated=false:rows=2:token_budget=0"
    cfg = s.config()  # the family's defaults fill in the rest
    assert cfg.rows == 2 and cfg.commit == "prefix" and not cfg.adaptive and cfg.relax.lam == 2.0


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_parameter_of_every_family_is_reachable(family):
    cfg = DecodeSpec(family).config()
    if cfg is None:
        return
    for f in fields(cfg):
        if f.name == "relax":
            for r in fields(cfg.relax):
                if FAMILIES[family].relaxed:
                    assert r.name in FAMILIES[family].params
            continue
        assert f.name in FAMILIES[family].params, (family, f.name)


@pytest.mark.parametrize("text, message", [
    ("nope", "unknown decoder 'nope'"), ("csd:lam", "expected key=value"), ("sjd:lam=1", "no parameter(s) ['lam']"),
    ("csd:lam=1:lam=2", "given twice"), ("ar:cfg=abc", "cfg must be a number"), ("ar:top_p=2", "top_p"),
    ("sjd:heads=x", "takes no heads"), ("ssd:rows=9", "rows must be"),
])
def test_bad_specs_name_the_problem(text, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        DecodeSpec.parse(text)


def test_compared_decoders_share_sampling():
    assert common_sampling([DecodeSpec.parse("ar"), DecodeSpec.parse("csd:lam=1")]) == SamplingConfig()
    with pytest.raises(ValueError, match="share their sampling"):
        common_sampling([DecodeSpec.parse("ar:cfg=2"), DecodeSpec.parse("csd")])


def test_the_spec_decodes_as_it_says(tmp_path):
    from tiny import tiny_model
    m = tiny_model(tmp_path / "t")
    greedy = DecodeSpec.parse("sjd:window=4:temperature=0")
    ar = DecodeSpec.parse("ar:temperature=0")
    p = ["a large red circle at the center on a flat gray background"]
    assert run(greedy, m, p, [0]).tokens.tolist() == run(ar, m, p, [0]).tokens.tolist()
