"""Fixtures for the deploy tests: the rendered overlays (kubectl kustomize), once a session."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.deploy.k8s_render import OVERLAYS, render_overlay


@pytest.fixture(scope="session")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    return {o: render_overlay(o, tmp_path_factory.mktemp(o)) for o in OVERLAYS}
