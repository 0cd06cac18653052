"""``simserve serve``: a scenario's simulated cluster behind a live OpenAI-compatible endpoint.

``api`` is the contract (a simulation that accepts a request now and streams its tokens on the
wall clock), ``http`` the vLLM-shaped HTTP front end, ``driver`` the engine on the wall clock,
``serve`` the command. Only ``driver`` knows the engine; only ``http`` knows aiohttp's server.
"""
