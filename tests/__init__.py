"""Prism's test suite, a package: its folders mirror the rooms of the code."""
