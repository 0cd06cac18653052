"""simserve and live servers, both ways.

Against a live OpenAI-compatible server: ``replay`` sends a scenario's workload to it through
the shared HTTP client (``client``); ``calibrate`` probes it (``probes``) and fits a profile
(``fit``); ``fidelity`` tables real against simulated (docs/fidelity.md).

As a live server (``simserve serve``): ``api`` is the contract (a simulation that accepts a
request now and streams its tokens on the wall clock), ``http`` the vLLM-shaped HTTP front end,
``driver`` the engine on the wall clock, ``serve`` the command (docs/serve.md). Only ``driver``
knows the engine; only ``http`` knows aiohttp's server.
"""
