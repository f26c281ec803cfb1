"""``ragspec``'s public names: each resolves, lazily, to the object of the module that defines it."""

from __future__ import annotations

import importlib

import pytest

import ragspec


@pytest.mark.parametrize("name", ragspec.__all__)
def test_every_public_name_is_its_module_s_object(name: str) -> None:
    module = importlib.import_module(ragspec._LAZY[name])
    assert getattr(ragspec, name) is getattr(module, name)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        ragspec.Nope  # noqa: B018
