"""The one typed decode spec: parsed once from text, canonical, round-trips through its dict (how it
reaches the actors), and every decoder parameter and sampling setting is reachable from it."""

from dataclasses import fields

import pytest

from ssdgen.decoders import run
from ssdgen.decoders.recipes import BLOCK_RECIPES, RECIPES, Relaxation, SamplingConfig, recipe
from ssdgen.decoders.spec import DecodeSpec, common_sampling


def test_parse_canonical_text_and_round_trips():
    s = DecodeSpec.parse("ssd+csd:two_d=true:rows=2:calibrated=false:cfg=2:top_k=50")
    assert s.family == "ssd+csd" and dict(s.params) == {"calibrated": False, "rows": 2, "two_d": True}
    assert s.sampling == SamplingConfig(cfg_scale=2.0, top_k=50)
    assert str(s) == "ssd+csd:calibrated=false:rows=2:two_d=true:cfg=2.0:temperature=1.0:top_k=50:top_p=1.0"
    assert DecodeSpec.parse(str(s)) == s == DecodeSpec.from_dict(s.to_dict())
    assert s.label == "ssd+csd:calibrated=false:rows=2:two_d=true"
    cfg = s.config()  # the family's defaults fill in the rest
    assert cfg.rows == 2 and cfg.commit == "prefix" and not cfg.adaptive and cfg.relax.lam == 2.0


# every recipe, by the parameters that select it: each family, and ssd / ssd+csd with commit=block
SELECTS = [(f, {}) for f in RECIPES] + [(f, {"commit": "block"}) for f in BLOCK_RECIPES]


@pytest.mark.parametrize("family, given", SELECTS)
def test_every_parameter_of_every_recipe_is_reachable(family, given):
    """Each parameter a recipe takes is a field of its config, and every field of a config is some recipe's
    parameter, except the drafter (the recipe's own choice); the relaxation only where the recipe relaxes."""
    r = recipe(family, given)
    cfg = DecodeSpec.of(family, given).config()
    if cfg is None:
        return
    names = {f.name for f in fields(cfg)}
    assert r.params <= names and cfg.drafter == r.drafter
    assert r.relaxed or not cfg.relax.active
    same_loop = [q for q in [*RECIPES.values(), *BLOCK_RECIPES.values()] if q.config is r.config]
    assert names - {"relax", "drafter"} <= set().union(*(q.params for q in same_loop)), (family, given)


@pytest.mark.parametrize("text, message", [
    ("nope", "unknown decoder 'nope'"), ("csd:lam", "expected key=value"), ("sjd:lam=1", "no parameter(s) ['lam']"),
    ("csd:lam=1:lam=2", "given twice"), ("ar:cfg=abc", "cfg must be a number"), ("ar:top_p=2", "top_p"),
    ("sjd:heads=x", "takes no heads"), ("ssd:rows=9", "rows must be"),
])
def test_bad_specs_name_the_problem(text, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        DecodeSpec.parse(text)


@pytest.mark.parametrize("text, closest", [
    ("sdd+csd", "'ssd+csd'"), ("SSD+CSD", "'ssd+csd'"), ("sjdd", "'sjd'"), ("cds", "'csd'"),
    ("csd:lamb=1", "'lam'"), ("ssd:rowz=2", "'rows'"),
])
def test_a_typo_is_answered_with_the_closest_name(text, closest):
    """#49: a mistyped family or parameter names the closest known one(s) on the same line, then every name."""
    with pytest.raises(ValueError) as e:
        DecodeSpec.parse(text)
    assert f"(did you mean {closest}?)" in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert "choose one of: ar, sjd, csd, ssd, ssd+csd" in str(e.value) or "it takes [" in str(e.value)


def test_a_name_close_to_none_gets_no_suggestion():
    with pytest.raises(ValueError, match="unknown decoder 'nope'; choose one of") as e:
        DecodeSpec.parse("nope")
    assert "did you mean" not in str(e.value)


def _field_kinds(family: str) -> dict[str, str]:
    """Each parameter of a family -> its config field's declared type name."""
    from ssdgen.decoders.recipes import Relaxation, WindowConfig
    r = RECIPES[family]
    kinds = {f.name: str(f.type) for c in (r.config or WindowConfig, Relaxation) for f in fields(c)}
    return {k: kinds[k] for k in _params(family)}


def _params(family: str) -> list[str]:
    r = RECIPES[family]
    return sorted(r.params | ({f.name for f in fields(Relaxation)} if r.relaxed else set()))


# a value of the wrong kind for each declared type, as the user types it, and what the message must say
WRONG = {"bool": ("yes", "must be true or false", "'yes'"), "int": ("2.5", "must be an integer", "2.5"),
         "float": ("abc", "must be a number", "'abc'"), "str": ("bogus", "must be one of", "'bogus'")}


@pytest.mark.parametrize("family, key", [(f, k) for f in RECIPES for k in _params(f)])
def test_every_parameter_checks_its_type(family, key):
    kind = _field_kinds(family)[key]
    value, says, shown = WRONG[kind]
    text = f"{family}:{key}={value}"
    with pytest.raises(ValueError) as e:
        DecodeSpec.parse(text)
    msg = str(e.value)
    assert msg.startswith(f"decoder spec {text!r}: {key} {says}") and msg.endswith(f"got {shown}"), msg


@pytest.mark.parametrize("text, message", [
    ("csd:lam=abc", "decoder spec 'csd:lam=abc': lam must be a number, got 'abc'"),
    ("ssd:rows=true", "decoder spec 'ssd:rows=true': rows must be an integer, got True"),
    ("csd:coupled=1", "decoder spec 'csd:coupled=1': coupled must be true or false, got 1"),
    ("sjd:init=3", "decoder spec 'sjd:init=3': init must be one of random, repeat-left, repeat-above, got 3"),
    ("ssd:heads=", "decoder spec 'ssd:heads=': heads needs a path"),
])
def test_wrong_kinds_are_one_line_naming_spec_key_type_and_value(text, message):
    with pytest.raises(ValueError) as e:
        DecodeSpec.parse(text)
    assert str(e.value).startswith(message), str(e.value)


def test_python_callers_and_typed_configs_get_the_same_checks():
    from ssdgen.decoders.recipes import BlockConfig, WindowConfig
    with pytest.raises(ValueError, match=r"decoder spec 'csd:lam=abc': lam must be a number, got 'abc'"):
        DecodeSpec.of("csd", {"lam": "abc"})
    for make, message in [(lambda: Relaxation(lam="abc"), "lam must be a number"),
                          (lambda: WindowConfig(coupled="yes"), "coupled must be true or false"),
                          (lambda: BlockConfig(max_rows=2.5), "max_rows must be an integer"),
                          (lambda: SamplingConfig(temperature="hot"), "temperature must be a number")]:
        with pytest.raises(ValueError, match=message):  # a ValueError, never TypeError from a range check
            make()
    assert DecodeSpec.parse("csd:lam=1:delta=0").config().relax.lam == 1  # an int is a number


def test_lossless_ssd_csd_names_the_fix():
    with pytest.raises(ValueError, match=r"ssd:lossless=true is the lossless spatial decoder"):
        DecodeSpec.parse("ssd+csd:lossless=true")
    assert DecodeSpec.parse("ssd:lossless=true").config().lossless


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
