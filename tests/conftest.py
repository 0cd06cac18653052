"""Markers shared by the test modules."""


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "compile: compiles kernels with torch.compile (seconds per shape family; "
                   "kept to one family so CI still runs it)")
