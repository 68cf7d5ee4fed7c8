"""tiledsl: a language, compiler and runtime for GPU kernels that overlap communication with compute."""
__version__ = "0.1.0"
