"""Prism's command line and the wiring between the runtime and its dashboards."""
