"""The package version (read by setup.py too)."""

__version__ = "0.1.0"
