"""property tests (see tests/README.md)."""
