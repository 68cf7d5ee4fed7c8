"""tiledsl's version: stamped into every generated module and tuning cache, and `tiledsl --version`.
A module of its own so that code generation reads it without importing the package's front door."""
__version__ = "0.1.0"
