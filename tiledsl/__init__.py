"""tiledsl: a language, compiler and runtime for GPU kernels that overlap communication with compute."""
from tiledsl.version import __version__  # noqa: F401 - tiledsl.__version__


def compile(source, heap=None, **options):  # noqa: A001 - the natural name, as in torch.compile
    """See tiledsl.api.compile."""
    from tiledsl.api import compile as _compile
    return _compile(source, heap, **options)


def empty(shape, dtype=None, heap=None):
    """See tiledsl.api.empty."""
    from tiledsl.api import empty as _empty
    return _empty(shape, dtype, heap)
