"""Kernel profiler for simserve: the only package that imports torch.

``python -m profiler --model NAME --device cpu|cuda --out profile.json`` measures a model's
decoder kernels on this machine and writes a profile that simserve reads through
:mod:`simserve.latency.schema` (which imports no torch). Importing this package imports nothing
heavy; it imports simserve, never the reverse.
"""
