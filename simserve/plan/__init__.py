"""``simserve.plan(scenario, target_rate, *, space=None, overrides=None, executor="local",
workers=None, address=None, prune=True, log=None) -> PlanResult``: the cheapest deployment
(hardware, parallelism, P:D split, engine knobs, replicas) serving ``target_rate`` req/s
within the scenario's SLOs, over the space of ``space`` (or the scenario's ``plan:`` section).
``help(simserve.plan.planner.plan)`` says more; docs/capacity.md has the whole story.

This package also holds the rest of the planning over many simulations: grids of variants
(``sweep``), capacity search (``capacity``) and deployment planning (``planner``), exported as
``simserve.sweep(...)``, ``simserve.capacity(...)`` and ``simserve.plan(...)``: this package
is itself callable, as ``planner.plan`` (a package and a function cannot share the name
``simserve.plan`` otherwise, since importing a submodule sets the package as that attribute).
"""

import sys
import types


class _CallablePackage(types.ModuleType):
    def __call__(self, *args, **kwargs):
        from simserve.plan.planner import plan
        return plan(*args, **kwargs)

    @property
    def __signature__(self):
        """``planner.plan``'s: what ``inspect.signature`` (and Jupyter's ``simserve.plan?``)
        shows for the callable package."""
        import inspect

        from simserve.plan.planner import plan
        return inspect.signature(plan)


sys.modules[__name__].__class__ = _CallablePackage
