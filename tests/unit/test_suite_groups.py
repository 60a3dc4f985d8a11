"""How `make test` splits the suite over its xdist workers (tests/conftest.py): a group
of modules goes to one worker as one unit, so the modules that share a Ray cluster start it
once and the lab's modules, which each build the machine's one lab, never overlap."""

from tests.conftest import xdist_scope


def test_the_lab_modules_are_one_unit_and_never_run_at_once() -> None:
    assert xdist_scope("tests/lab/test_lab.py::test_down_leaves_nothing_behind") == \
        xdist_scope("tests/lab/test_faults.py::test_host_crash_is_diagnosed[x]") == "lab"


def test_shared_cluster_modules_are_one_unit_and_others_their_own() -> None:
    a = xdist_scope("tests/integration/runtime/test_preemption.py::test_a")
    b = xdist_scope("tests/integration/runtime/test_training.py::test_b")
    assert a == b == "runtime-cluster"
    assert xdist_scope("tests/integration/watchdog/test_user_hangs.py::t") == \
        xdist_scope("tests/integration/watchdog/test_runtime_hangs.py::t") == "watchdog-ray"
    assert xdist_scope("tests/unit/test_spec.py::test_x") == "tests/unit/test_spec.py"
    assert xdist_scope("tests/e2e/test_dashboard_runtime.py::t") == \
        "tests/e2e/test_dashboard_runtime.py"


def test_the_long_modules_are_modules_of_their_own_outside_the_fillers_share() -> None:
    """A LONG_MODULES entry is handed out right after the groups to a front worker: it must
    name a module that exists, is its own unit and is not the filler's."""
    from pathlib import Path

    from tests.conftest import LONG_MODULES, filler_scope

    root = Path(__file__).resolve().parents[2]
    for module in LONG_MODULES:
        assert (root / module).is_file(), module
        assert xdist_scope(module + "::t") == module and not filler_scope(module), module
