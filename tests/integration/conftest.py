"""Fixtures of the integration tests that only some need."""

from __future__ import annotations

import pytest
from cdclake_local.registry import stack_registry


@pytest.fixture(scope="session")
def registry(stack):
    """The local stack's schema registry (Apicurio), started once for the session."""
    registry = stack_registry(stack.s.state_dir)
    registry.start()
    yield registry
    registry.stop()
