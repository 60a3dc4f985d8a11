"""`python -m meshyard.runner MODE ...`: how every rank process of a user-code job starts.

    script PATH [ARGS...]     a Python script, as `python PATH ARGS` would run it
    module NAME [ARGS...]     `python -m NAME ARGS`
    code TEXT [ARGS...]       `python -c TEXT ARGS`
    function MODULE:NAME      Ray Train style: the default process group first, then
                              NAME(config) with config from MESHYARD_FUNCTION_CONFIG
    exec ARGV...              any other program (execvp), after the steps below

Before the user's code runs, the runner (1) asks the kernel to kill this process when the
worker actor that started it dies (PR_SET_PDEATHSIG, so a killed actor leaves no rank behind)
and (2) calls `_before_user_code()`, the one place where meshyard loads what it runs inside
every rank: the hang watchdog's probe (meshyard/_probe.py, a side thread; not for `exec`,
whose program replaces this process) when MESHYARD_PROBE_DIR is set. The reporting channel
is opened lazily by `meshyard.train`. It imports
nothing of meshyard's control plane, so user packages named `api`, `workers` or
`orchestrator` import as the user's own.

An exception from the user's code is written to MESHYARD_REPORT_FILE as an `error` record
(type, message, traceback; `setup: true` when the code could not even be loaded: a missing
script, a module or function that does not import), printed to stderr as Python would, and
the process exits 1.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import inspect
import json
import os
import runpy
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from meshyard import _protocol as proto

_PR_SET_PDEATHSIG = 1


class SetupError(Exception):
    """The entry point could not be loaded (wraps the original exception)."""


# What a script, module or code string left in its globals lives until the process exits,
# as `python train.py` keeps `__main__`'s: runpy hands the globals back when the code
# returns, and dropping them would destroy the user's objects at once (a DDP model freed
# right after its last collective deadlocks: ~ProcessGroupGloo joins a gloo thread that
# waits for the GIL the freeing thread holds).
_KEPT_GLOBALS: list[dict[str, Any]] = []


def _die_with_parent() -> None:
    parent = os.environ.get(proto.PARENT_PID)
    if not parent or not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if str(os.getppid()) != parent:  # the parent died before prctl took effect
        os._exit(1)


def _before_user_code(mode: str = "script") -> None:
    """Runs in every rank process before the user's code."""
    _die_with_parent()
    if mode != "exec":
        from meshyard import _probe

        _probe.start()


def _record(kind: str, **fields: Any) -> None:
    path = os.environ.get(proto.REPORT_FILE)
    if not path:
        return
    line = json.dumps({"kind": kind, "time": time.time(), **fields}, default=str)
    try:
        with open(path, "a", encoding="utf-8", opener=_no_link) as f:
            f.write(line[:proto.MAX_RECORD_CHARS] + "\n")
    except OSError:
        pass


def _no_link(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW, 0o600)


def _load_function(path: str) -> Callable[..., Any]:
    module, _, name = path.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except AttributeError:
        raise SetupError(AttributeError(f"module {module!r} has no attribute {name!r}")) \
            from None
    except BaseException as exc:  # noqa: BLE001 - any failure to import is a setup error
        raise SetupError(exc) from exc
    if not callable(fn):
        raise SetupError(TypeError(f"{path} is a {type(fn).__name__}, not a function"))
    return fn


def _run_function(path: str) -> None:
    sys.path.insert(0, os.getcwd())
    fn = _load_function(path)
    config_file = os.environ.get(proto.FUNCTION_CONFIG)
    config = json.loads(Path(config_file).read_text()) if config_file else {}
    from meshyard.parallel import ensure_process_group

    ensure_process_group()
    import torch.distributed as dist

    try:
        fn(config) if inspect.signature(fn).parameters else fn()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _run_script(path: str, args: list[str]) -> None:
    script = Path(path)
    try:
        compile(script.read_bytes(), str(script), "exec")
    except (OSError, SyntaxError, ValueError) as exc:
        raise SetupError(exc) from exc
    sys.argv = [path, *args]
    sys.path[0] = str(script.resolve().parent)
    _KEPT_GLOBALS.append(runpy.run_path(path, run_name="__main__"))


def _run_module(name: str, args: list[str]) -> None:
    sys.argv = [name, *args]
    sys.path[0] = os.getcwd()
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as exc:
        raise SetupError(exc) from exc
    if spec is None:
        raise SetupError(ModuleNotFoundError(f"No module named {name!r}", name=name))
    _KEPT_GLOBALS.append(runpy.run_module(name, run_name="__main__", alter_sys=True))


def _run(mode: str, rest: list[str]) -> None:
    if mode == "script":
        _run_script(rest[0], rest[1:])
    elif mode == "module":
        _run_module(rest[0], rest[1:])
    elif mode == "code":
        sys.argv = ["-c", *rest[1:]]
        sys.path[0] = ""
        globs: dict[str, Any] = {"__name__": "__main__"}
        _KEPT_GLOBALS.append(globs)
        exec(compile(rest[0], "<string>", "exec"), globs)  # noqa: S102
    elif mode == "function":
        _run_function(rest[0])
    elif mode == "exec":
        try:
            os.execvp(rest[0], rest)
        except OSError as exc:
            raise SetupError(_exec_error(rest[0], exc)) from None
    else:
        raise SetupError(ValueError(f"unknown runner mode {mode!r}"))


def _exec_error(program: str, exc: OSError) -> OSError:
    """`exc` from exec'ing `program`, with a message that names the program (exec's own
    names none) and says where it was looked for."""
    if isinstance(exc, FileNotFoundError):
        where = (f"in the working dir {os.getcwd()}" if "/" in program
                 else "on the rank's PATH (a program in the working dir is written ./NAME)")
        why = f"program {program!r} not found {where}"
    elif isinstance(exc, PermissionError):
        why = f"program {program!r} is not executable (chmod +x, or run it with python)"
    else:
        why = f"cannot run program {program!r}: {exc.strerror or exc}"
    return type(exc)(why)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    _before_user_code(args[0])
    try:
        _run(args[0], args[1:])
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except SetupError as wrapped:
        cause = wrapped.__cause__ or wrapped.args[0]
        _fail(cause if isinstance(cause, BaseException) else wrapped, setup=True)
        return 1
    except BaseException as exc:  # noqa: BLE001 - reported, then the rank exits 1
        _fail(exc, setup=False)
        return 1
    return 0


def _fail(exc: BaseException, *, setup: bool) -> None:
    tb = "".join(traceback.format_exception(exc))
    sys.stderr.write(tb)
    sys.stderr.flush()
    _record("error", type=type(exc).__name__, message=str(exc)[:2000] or type(exc).__name__,
            traceback=tb[-8000:], setup=setup)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.exit(code)
