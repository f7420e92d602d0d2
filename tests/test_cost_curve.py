"""The cost curve interpolates between measured points and extrapolates along its last slope; a real profile
on a tiny model has the right shape. (The planner that decides from curves: test_planner.py.)"""

import pytest

from ssdgen.decoders import decode
from ssdgen.decoders.cost_curve import CostCurve
from ssdgen.decoders.planner import measure_profile
from ssdgen.decoders.recipes import SamplingConfig
from tiny import tiny_model

SIZES = (1, 2, 4, 8, 16, 32, 64)
SAMPLED = SamplingConfig(cfg_scale=3.0)


def test_curve_interpolates_and_extends_along_its_last_slope():
    c = CostCurve(1, SIZES, tuple(1.0 + s for s in SIZES))
    assert c.time(3) == pytest.approx(4) and c.time(128) == pytest.approx(129)
    assert CostCurve(1, (1,), (2.0,)).time(1) == 2.0


def test_measured_profile_on_a_real_model(tmp_path):
    tiny = tiny_model(tmp_path / "t")
    p = measure_profile(tiny, "a large red circle at the center on a flat gray background", True, (1, 2),
                        (1, 5, 33), reps=2)
    assert sorted(p.curves) == [1, 2] and p.seconds > 0
    assert p.curves[1].tokens == (1, 5, 33) and p.curves[2].tokens == (1, 5, 33)  # 33 > WIDE: only at batch <= 16
    assert all(t > 0 for c in p.curves.values() for t in c.seconds)


def test_calibrated_and_a_token_budget_are_exclusive():
    with pytest.raises(ValueError, match="calibrated and token_budget"):
        decode("ssd+csd", None, [], [], SAMPLED, {"token_budget": 64, "commit": "block"})
