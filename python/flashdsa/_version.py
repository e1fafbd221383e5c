"""The package version (read by setup.py too)."""

__version__ = "0.2.0"
