"""A package's public names imported on first use (PEP 562), so that importing the package is cheap
and needs none of an extra's packages: ``ragspec`` and ``retrievers`` resolve their names this way."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(package: str, names: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package`` whose public ``names`` map to their modules.

    A name is imported from its module on first access and then kept in the package's namespace.
    """
    namespace = vars(sys.modules[package])

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted([*namespace, *names])

    return __getattr__, __dir__
