"""Tests of the public surface of loopwright_testing."""

from __future__ import annotations

import importlib.metadata

import pytest

import loopwright_testing
from loopwright_testing import contract, pytest_plugin, store_contract


def test_all_is_sorted_and_complete():
    """__all__ is sorted, every name in it resolves, and the lazy table lists exactly those names."""
    assert loopwright_testing.__all__ == sorted(loopwright_testing.__all__)
    assert set(loopwright_testing._LAZY) == set(loopwright_testing.__all__)
    for name in loopwright_testing.__all__:
        assert getattr(loopwright_testing, name) is not None
        assert name in dir(loopwright_testing)
    for module in (contract, pytest_plugin, store_contract):
        assert module.__all__ == sorted(module.__all__)
        assert all(hasattr(module, name) for name in module.__all__)


def test_unknown_names_raise_attribute_error():
    """An unknown attribute raises AttributeError, as for any module."""
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = loopwright_testing.nope


def test_entry_points_are_declared():
    """The distribution is a loopwright plugin named testing and a pytest plugin named loopwright."""
    eps = importlib.metadata.entry_points()
    assert next(iter(eps.select(group="loopwright", name="testing"))).value == "loopwright_testing"
    assert next(iter(eps.select(group="pytest11", name="loopwright"))).value == "loopwright_testing.pytest_plugin"
    assert loopwright_testing.__version__ == importlib.metadata.version("loopwright-testing")


def test_registration_hook_registers_both_kinds():
    """The plugin registers the provider kinds test and scripted."""
    registered = {}
    loopwright_testing.loopwright_register_providers(register=registered.__setitem__)
    assert registered == {
        "test": loopwright_testing.TestProvider,
        "scripted": loopwright_testing.ScriptedProvider,
    }
