"""Architecture rules (docs/architecture.md), checked on the source tree:

1. The pure core imports no Ray, FastAPI, SQLAlchemy or torch: every module under
   orchestrator/ except the store and the Ray glue in runtime/ (its pure policy, events and
   failure grouping included), plus workers.host.assignment. Each is imported in a fresh
   interpreter and sys.modules is checked after every import, naming the module that pulled a
   framework in.
2. runtime/ is the only package under orchestrator/ that imports ray (anywhere in a module,
   lazy imports included).
3. workers/ imports from orchestrator only contracts and pure parsers.
4. No import cycle between orchestrator's packages and modules, or between orchestrator and
   workers; the only arrow from orchestrator into workers is runtime/ launching worker actors;
   nothing imports api/.
5. api/ (the REST server, the dashboard and the CLI) imports no ray and nothing of workers/;
   it reaches the Ray glue only where it starts it: `meshyard serve` builds the runtime
   (api.server) and `meshyard calibrate` runs the benchmark (api.cli.plan_cmds). No route
   module imports another route module.
6. meshyard/ (what runs inside a user's rank process) imports nothing from api/, workers/ or
   orchestrator/ (a user's own packages of those names must not collide with it), and
   `import meshyard.train` / `meshyard.runner` load no torch.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("ray", "fastapi", "sqlalchemy", "torch")
IMPURE_PACKAGES = ("orchestrator.store", "orchestrator.runtime")
PURE_IN_IMPURE = ("orchestrator.runtime", "orchestrator.runtime.events",
                  "orchestrator.runtime.policy", "orchestrator.runtime.failures")
PURE_WORKERS = ("workers.host.assignment",)
WORKERS_MAY_IMPORT = (
    "orchestrator.spec", "orchestrator.mesh", "orchestrator.admission.documents", "orchestrator.isolation.worker_env",
    "orchestrator.watchdog.flight_recorder", "orchestrator.watchdog.logs",
    "orchestrator.watchdog.evidence_files", "orchestrator.watchdog.probe_files",
    "orchestrator.planner.calibration.fit",
    "orchestrator.usercode.entrypoint", "orchestrator.isolation.worker_env", "orchestrator.bounds.limits",
    "orchestrator.usercode.packages", "orchestrator.preflight.verdict", "orchestrator.isolation.runfiles",
    "orchestrator.isolation.modes", "orchestrator.storage.object_storage",
)

SCRIPT = """
import importlib, json, sys
forbidden = {forbidden!r}
out = {{}}
for name in {modules!r}:
    importlib.import_module(name)
    out[name] = sorted(m for m in sys.modules if m.split(".")[0] in forbidden)
print(json.dumps(out))
"""


def module_files(package: str) -> dict[str, Path]:
    """Module name -> file, for every module of a top-level package in this tree."""
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = {**module_files("orchestrator"), **module_files("workers")}


def pure_modules() -> list[str]:
    names = [m for m in module_files("orchestrator")
             if not m.startswith(IMPURE_PACKAGES) or m in PURE_IN_IMPURE]
    return [*names, *PURE_WORKERS]


def _type_only(tree: ast.AST) -> set[int]:
    """Ids of the import nodes under `if TYPE_CHECKING:` (they never run)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return out


def imports_of(path: Path, name: str, *, type_only: bool = True) -> Iterator[str]:
    """Every module `path` imports, at any depth (lazy imports inside functions too);
    `type_only=False` leaves out the imports only type checkers run."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    skip = set() if type_only else _type_only(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([base] if base else [])])
            for a in node.names:
                sub = f"{base}.{a.name}"
                yield sub if sub in MODULES else base


def graph(modules: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of this tree it imports when it runs."""
    return {m: {i for i in imports_of(p, m, type_only=False) if i in MODULES and i != m}
            for m, p in modules.items()}


def unit(module: str) -> str:
    """What the package rules talk about: workers, a top-level orchestrator module (spec,
    mesh, ...), or an orchestrator package (placement, runtime, ...)."""
    parts = module.split(".")
    return "workers" if parts[0] == "workers" else ".".join(parts[:2])


def find_cycle(edges: Mapping[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph as [a, b, ..., a], or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                return [*stack[stack.index(m):], m]
            if m not in state and (found := visit(m)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(edges):
        if n not in state and (found := visit(n)):
            return found
    return None


def _probe(modules: list[str]) -> dict[str, list[str]]:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(forbidden=FORBIDDEN, modules=modules)],
        capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    loaded: dict[str, list[str]] = json.loads(proc.stdout)
    return loaded


def test_pure_modules_load_no_heavy_frameworks() -> None:
    modules = pure_modules()
    for must in ("orchestrator.topology.nvidia_smi", "orchestrator.placement.solver",
                 "orchestrator.planner.planner", "orchestrator.watchdog.monitor",
                 "orchestrator.runtime.policy", "orchestrator.settings", "workers.host.assignment"):
        assert must in modules
    loaded = _probe(modules)
    assert list(loaded) == modules
    offenders = {}
    previous: set[str] = set()
    for name in modules:
        new = set(loaded[name]) - previous
        if new:
            offenders[name] = sorted(new)
        previous |= set(loaded[name])
    assert offenders == {}, f"pure modules pulled in heavy frameworks: {offenders}"


def test_the_purity_check_can_fail() -> None:
    # The same probe sees a heavy import when there is one (guards against a vacuous test).
    assert "sqlalchemy" in _probe(["orchestrator.store.models"])["orchestrator.store.models"]


def test_only_the_runtime_imports_ray() -> None:
    users = sorted(m for m, p in module_files("orchestrator").items()
                   if any(i.split(".")[0] == "ray" for i in imports_of(p, m)))
    assert users, "the scan found no ray import at all"
    assert [m for m in users if not m.startswith("orchestrator.runtime")] == []


def test_workers_import_only_contracts_and_pure_parsers_from_orchestrator() -> None:
    seen = {i for m, p in module_files("workers").items() for i in imports_of(p, m)
            if i.split(".")[0] == "orchestrator"}
    assert "orchestrator.spec" in seen
    assert sorted(seen - set(WORKERS_MAY_IMPORT)) == []


def test_no_import_cycles_and_one_arrow_into_workers() -> None:
    edges = graph(MODULES)
    assert find_cycle(edges) is None, f"module import cycle: {find_cycle(edges)}"
    units: dict[str, set[str]] = {}
    for m, targets in edges.items():
        units.setdefault(unit(m), set()).update(unit(t) for t in targets if unit(t) != unit(m))
    assert find_cycle(units) is None, f"package import cycle: {find_cycle(units)}"
    into_workers = sorted(u for u, targets in units.items()
                          if "workers" in targets and u != "workers")
    assert into_workers == ["orchestrator.runtime"]
    api_users = sorted(m for m, p in MODULES.items()
                       if any(i.split(".")[0] == "api" for i in imports_of(p, m)))
    assert api_users == []


def test_the_cycle_check_can_fail() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_meshyard_imports_nothing_of_the_service_and_loads_light() -> None:
    ours = ("api", "workers", "orchestrator")
    offenders = {m: sorted(i for i in imports_of(p, m) if i.split(".")[0] in ours)
                 for m, p in module_files("meshyard").items()}
    assert "meshyard.runner" in offenders and "meshyard.train.torch" in offenders
    assert {m: i for m, i in offenders.items() if i} == {}
    loaded = _probe(["meshyard.train", "meshyard.runner"])
    assert loaded == {"meshyard.train": [], "meshyard.runner": []}


RUNTIME_ENTRIES = ("api.server", "api.cli.plan_cmds")


def test_api_imports_no_ray_no_workers_and_the_runtime_only_where_it_starts_it() -> None:
    api = module_files("api")
    assert "api.routes.jobs" in api and "api.cli.plan_cmds" in api
    heavy = {m: sorted(i for i in imports_of(p, m) if i.split(".")[0] in ("ray", "workers"))
             for m, p in api.items()}
    assert {m: i for m, i in heavy.items() if i} == {}
    runtime_users = sorted(m for m, p in api.items()
                           if any(i.startswith("orchestrator.runtime") for i in imports_of(p, m)))
    assert runtime_users == sorted(RUNTIME_ENTRIES)


def test_no_route_module_imports_another() -> None:
    api = module_files("api")
    routes = {m for m in api if m.startswith("api.routes.")}
    assert len(routes) >= 10
    crossing = {m: sorted(i for i in imports_of(api[m], m)
                          if i.startswith("api.routes") and i != m)
                for m in routes}
    assert {m: i for m, i in crossing.items() if i} == {}



def test_workers_modules_form_no_cycle_even_through_type_only_imports() -> None:
    workers = module_files("workers")
    edges = {m: {i for i in imports_of(p, m) if i in workers and i != m}
             for m, p in workers.items()}
    assert "workers.loop.step_contract" in edges["workers.loop.pipeline"]
    assert find_cycle(edges) is None, f"workers import cycle: {find_cycle(edges)}"
