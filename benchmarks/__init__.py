"""Measured figures, run by `make bench` and never by the tests."""
