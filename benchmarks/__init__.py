"""The benchmark scripts, and the suites that run them: ``python -m benchmarks list`` (see ``__main__``)."""
