"""The latency model's optional capabilities (latency/base.py): declared as Protocols, resolved
once into a ``Pricing`` record, and never probed by attribute anywhere else."""

from __future__ import annotations

import ast
from pathlib import Path

from simserve.cards import load_hardware, load_model
from simserve.latency.base import Pricing
from simserve.latency.pipeline import PipelineLatency
from simserve.latency.roofline import ConstantLatency, LinearLatency, RooflineModel
from simserve.latency.spec import SpeculativeLatency
from simserve.sched.plan import StepPlan
from tests.unit.test_spec_decode import TOY, TOY_HW, spec

ROOT = Path(__file__).resolve().parents[2] / "simserve"
DECODE = StepPlan((1, 2, 3), (1, 1, 1), (), (), (100, 7, 40), 3)


def _roof(**kw) -> RooflineModel:
    return RooflineModel(load_model(TOY), load_hardware(TOY_HW), step_overhead_s=1e-3,
                         per_output_token_s=1e-5, **kw)


def test_roofline_offers_everything_but_stages():
    roof = _roof(frontend_delay_s=0.004)
    p = Pricing.of(roof)
    assert p.decode_stretch_sum is not None and p.mixed_step_sum is not None
    assert p.breakdown is not None and p.stages is None
    assert p.forget_prices is None              # it counts nothing as it prices
    assert p.frontend_delay_s == 0.004
    # step overhead + 3 sampled rows at 10 µs
    assert p.cpu_s(DECODE) == 1e-3 + 3 * 1e-5
    assert p.decode_stretch(DECODE)(0, 3) == [
        roof.step_time(DECODE._replace(decode_ctx=tuple(c + i for c in DECODE.decode_ctx)))
        for i in range(3)]


def test_a_plain_model_gets_the_fallbacks():
    p = Pricing.of(LinearLatency(0.01, 1e-4, 1e-3))
    assert p.decode_stretch_sum is None and p.forget_prices is None and p.breakdown is None
    assert p.stages is None and p.frontend_delay_s == 0.0 and p.warnings() == []
    assert p.cpu_s(DECODE) == 0.0
    # each step's plan priced: 0.01 + 3 tokens · 0.1 ms + 3 sequences · 1 ms
    assert p.decode_stretch(DECODE)(2, 2) == [0.01 + 3e-4 + 3e-3] * 2


def test_a_fixed_step_overhead_is_the_cpu_part():
    class Overhead(ConstantLatency):
        step_overhead_s = 0.002

    assert Pricing.of(Overhead(0.01)).cpu_s(DECODE) == 0.002


def test_speculation_keeps_the_base_cpu_part_and_delay_but_never_fast_forwards():
    base = _roof(frontend_delay_s=0.003)
    cfg = spec(method="eagle", num_speculative_tokens=2, synthetic_acceptance_length=1.5)
    lat = SpeculativeLatency(base, cfg, load_model(TOY), load_hardware(TOY_HW))
    p = Pricing.of(lat)
    assert p.mixed_step_sum is None                     # its steps carry the drafter's cost
    assert p.frontend_delay_s == 0.003 and p.cpu_s(DECODE) == base.cpu_s(DECODE)
    assert p.decode_stretch(DECODE)(0, 1) == [lat.step_time(DECODE)]
    assert p.breakdown is not None and "draft" in p.breakdown(DECODE)


def test_pipeline_prices_stages_and_the_base_cpu_part():
    base = _roof(frontend_delay_s=0.001)
    model = load_model(TOY)
    pp = PipelineLatency(base, model, load_hardware(TOY_HW), pipeline_parallel_size=2)
    p = Pricing.of(pp)
    assert p.stages is not None and p.decode_stretch_sum is None and p.breakdown is None
    assert p.cpu_s(DECODE) == base.cpu_s(DECODE) and p.frontend_delay_s == 0.001


def _probes(source: str, path: Path) -> list[str]:
    """``getattr``/``hasattr`` calls on a latency model in one module's source."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "hasattr") and node.args:
            target = ast.unparse(node.args[0])
            if target.split(".")[-1] in ("latency", "base") \
                    or path.name == "base.py" and path.parent.name == "latency":
                found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_attribute_probes_of_a_latency_model():
    """``getattr``/``hasattr`` on a latency model (``latency``, ``r.latency``, a wrapper's
    ``base``; any object in latency/base.py): none in simserve/, its capabilities being
    Protocols read through Pricing."""
    paths = sorted(ROOT.rglob("*.py"))
    assert len(paths) > 50 and ROOT / "latency" / "base.py" in paths     # the package is seen
    found = [hit for path in paths
             for hit in _probes(path.read_text(encoding="utf-8"), path.relative_to(ROOT))]
    assert found == [], "\n".join(found)
    # ...and the scan sees each kind of probe it forbids (and not other getattr calls)
    probes = ("getattr(latency, 'decode_stretch', None)\nhasattr(r.latency, 'stages')\n"
              "getattr(self.base, 'breakdown')\ngetattr(plan, 'padding', 0)\n")
    assert [hit.split(": ", 1)[1] for hit in _probes(probes, Path("engine/x.py"))] == [
        "getattr(latency, 'decode_stretch', None)", "hasattr(r.latency, 'stages')",
        "getattr(self.base, 'breakdown')"]
    assert len(_probes("getattr(plan, 'padding', 0)\n", Path("latency/base.py"))) == 1
