"""numba's ``njit`` where the ``compiled`` extra is installed, else the function as it is.

The planning kernels (``ragspec.engine.planning``) and the batch drafting kernel
(``ragspec.engine.ngram_batch``) are plain loops over numpy arrays written for numba. Inside vLLM,
where a step plans for hundreds of requests, numba is always there (vLLM depends on it). The own
engine plans one request per step, a few dozen array cells, which plain Python does in well under a
millisecond against a forward of tens: so ``pip install ragspec`` works without numba and llvmlite
(~200 MiB), and ``ragspec[compiled]`` (in ``ragspec[all]``) compiles the same functions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

try:
    from numba import njit as _njit
except ImportError:  # the `compiled` extra is not installed: run the same code in Python
    _njit = None


def njit(*args: Any, **options: Any) -> Any:
    """``numba.njit`` with the same call forms (``@njit`` and ``@njit(cache=True, ...)``), or the identity."""
    if _njit is not None:
        return _njit(*args, **options)
    if len(args) == 1 and callable(args[0]) and not options:
        return args[0]

    def keep(function: Callable[..., Any]) -> Callable[..., Any]:
        return function

    return keep

