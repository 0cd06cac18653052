"""simserve: a discrete-event simulator of LLM serving schedulers.

    import simserve
    result = simserve.run("scenarios/quickstart.yaml")
    result.requests, result.steps, result.summary

Top-level names are imported on first use, so ``import simserve`` stays cheap.
"""

__version__ = "0.1.0"

_EXPORTS = {
    "run": "simserve.runner", "Result": "simserve.runner", "compare": "simserve.runner",
    "load_variants": "simserve.config",
    "Scenario": "simserve.config", "load_scenario": "simserve.config",
    "parse_scenario": "simserve.config",
    "SimserveError": "simserve.errors", "ConfigError": "simserve.errors",
    "DataError": "simserve.errors",
    "sweep": "simserve.plan.sweep", "capacity": "simserve.plan.capacity",
    "CapacityResult": "simserve.plan.capacity",
    "PlanResult": "simserve.plan.planner",
}
# Submodules that are also the API: ``simserve.report.write_report``; ``simserve.plan(...)``
# (the package is callable: simserve/plan/__init__.py).
_MODULES = ("report", "plan")
__all__ = sorted([*_EXPORTS, *_MODULES])


def __getattr__(name: str):
    if name in _MODULES:
        import importlib
        return importlib.import_module(f"simserve.{name}")
    if name in _EXPORTS:
        import importlib
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'simserve' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The API too (imported on first use, so not yet in globals()): what `simserve.<TAB>`
    completes in IPython and Jupyter."""
    return sorted({*globals(), *__all__})
