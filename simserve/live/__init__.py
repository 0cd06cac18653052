"""simserve against a live server: replay a workload, calibrate a profile, compare the two.

``replay`` sends a scenario's workload to an OpenAI-compatible server through :mod:`client`;
``calibrate`` probes the same server and fits a profile; ``fidelity`` tables the errors.
See docs/fidelity.md.
"""
