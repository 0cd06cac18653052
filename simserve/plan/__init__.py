"""Planning over many simulations: grids of variants (``sweep``), capacity search
(``capacity``) and deployment planning (``planner``).

The functions are exported as ``simserve.sweep(...)``, ``simserve.capacity(...)`` and
``simserve.plan(...)``: this package is itself callable, as ``planner.plan`` (a package and a
function cannot share the name ``simserve.plan`` otherwise, since importing a submodule sets
the package as that attribute).
"""

import sys
import types


class _CallablePackage(types.ModuleType):
    def __call__(self, *args, **kwargs):
        from simserve.plan.planner import plan
        return plan(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
