"""simserve: a discrete-event simulator of LLM serving schedulers."""

__version__ = "0.1.0"

from simserve.config import Scenario, load_scenario, parse_scenario  # noqa: E402
from simserve.errors import ConfigError, DataError, SimserveError  # noqa: E402
from simserve.runner import Result, run  # noqa: E402

__all__ = ["ConfigError", "DataError", "Result", "Scenario", "SimserveError", "load_scenario",
           "parse_scenario", "run"]
