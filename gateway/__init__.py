"""The REST gateway of pybench-eval."""
