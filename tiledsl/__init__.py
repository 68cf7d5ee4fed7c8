"""tiledsl: a language, compiler and runtime for GPU kernels that overlap communication with compute."""
import os as _os

from tiledsl.version import __version__  # noqa: F401 - tiledsl.__version__

# Triton 3.9 warns on every compile that its FP-fusion default will change in 3.10 unless this is set;
# setting it to its current default (fusion on, what the kernels were checked and timed with) keeps the
# behaviour and keeps the warning off the user's terminal. A value the user set stands.
_os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")


def compile(source, heap=None, **options):  # noqa: A001 - the natural name, as in torch.compile
    """See tiledsl.api.compile."""
    from tiledsl.api import compile as _compile
    return _compile(source, heap, **options)


def empty(shape, dtype=None, heap=None):
    """See tiledsl.api.empty."""
    from tiledsl.api import empty as _empty
    return _empty(shape, dtype, heap)
