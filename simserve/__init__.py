"""simserve: a discrete-event simulator of LLM serving schedulers."""

__version__ = "0.1.0"
