"""Planning over many simulations: grids of variants (``sweep``) and capacity search (``capacity``).

The functions are exported as ``simserve.sweep(...)`` and ``simserve.capacity(...)``.
"""
