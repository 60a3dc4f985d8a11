"""Stacks now's grouping: ranks in the same user frames are one group whatever started them
(warm through meshyard._prestart or cold through meshyard.runner); frames are marked user,
library or wrapper."""

from __future__ import annotations

from orchestrator.watchdog.stacks import group_stacks, parse_frames

VENV = "/srv/venv/lib/python3.12/site-packages"
USER = ('  File "/code/train.py", line 40, in <module>\n    main()\n'
        '  File "/code/train.py", line 31, in main\n    step(model)\n'
        f'  File "{VENV}/torch/distributed/c10d_logger.py", line 81, in wrapper\n'
        '    return func(*args, **kwargs)\n')
COLD = ('  File "<frozen runpy>", line 198, in _run_module_as_main\n'
        '  File "<frozen runpy>", line 88, in _run_code\n'
        '  File "/opt/meshyard/meshyard/runner.py", line 212, in <module>\n    sys.exit(main())\n'
        '  File "/opt/meshyard/meshyard/runner.py", line 136, in _run_path\n'
        '    _KEPT_GLOBALS.append(runpy.run_path(path, run_name="__main__"))\n'
        '  File "<frozen runpy>", line 287, in run_path\n')
WARM = ('  File "<frozen runpy>", line 198, in _run_module_as_main\n'
        '  File "/opt/meshyard/meshyard/_prestart.py", line 140, in <module>\n'
        '    sys.exit(_serve())\n'
        '  File "/opt/meshyard/meshyard/_prestart.py", line 93, in _serve\n'
        '    return runner.main(list(req["args"]))\n'
        '  File "/opt/meshyard/meshyard/runner.py", line 136, in _run_path\n'
        '    _KEPT_GLOBALS.append(runpy.run_path(path, run_name="__main__"))\n'
        '  File "<frozen runpy>", line 287, in run_path\n')
MAIN = "MainThread (training)"


def test_a_warm_and_a_cold_rank_in_the_same_user_frames_are_one_group() -> None:
    other = USER.replace("line 31, in main\n    step(model)", "line 33, in main\n    save()")
    groups = group_stacks({0: {MAIN: COLD + USER}, 1: {MAIN: WARM + USER},
                           2: {MAIN: COLD + other}})
    assert [g.ranks for g in groups] == [(0, 1), (2,)]
    first = groups[0].to_dict()
    assert first["ranks_text"] == "0-1" and first["training"]
    # the group shows its lowest rank's stack, frames outermost first
    assert first["stack"] == (COLD + USER).rstrip()
    kinds = [f["kind"] for f in first["frames"]]
    assert kinds == ["wrapper"] * 5 + ["user", "user", "library"]
    assert first["user_frame"] == {"file": "/code/train.py", "line": 31, "func": "main",
                                   "code": "step(model)", "kind": "user"}


def test_frames_parse_the_source_line_and_keep_text_that_is_no_stack() -> None:
    frames = parse_frames(WARM + USER)
    assert (frames[1].file, frames[1].line, frames[1].func, frames[1].code, frames[1].kind) == (
        "/opt/meshyard/meshyard/_prestart.py", 140, "<module>", "sys.exit(_serve())", "wrapper")
    assert frames[0].code == ""  # a frozen frame prints no source line
    threads = '  File "/usr/lib/python3.12/threading.py", line 1012, in _bootstrap\n'
    assert parse_frames(threads)[0].kind == "wrapper"
    ray = f'  File "{VENV}/ray/_private/worker.py", line 9, in main_loop\n'
    assert parse_frames(ray)[0].kind == "wrapper"
    (g,) = group_stacks({0: {"t": "no stack here"}, 1: {"t": "no stack here\n"}})
    assert g.ranks == (0, 1) and g.frames == () and g.to_dict()["user_frame"] is None


def test_native_dumps_group_across_pids_thread_ids_and_addresses() -> None:
    from orchestrator.watchdog.stacks import MAX_NATIVE_BYTES, MAX_NATIVE_GROUPS, group_native

    def dump(pid: int, tid: str, addr: str, where: str = "train.py:12") -> str:
        return (f"Process {pid}: python train.py\nPython v3.11.7\n\n"
                f"Thread {tid} (idle): \"MainThread\"\n    __pthread_cond_wait (libc.so.6)\n"
                f"    {addr} (libtorch_cpu.so)\n    <module> ({where})\n")

    groups = group_native({0: dump(101, "101", "0x7f00aa"), 1: dump(202, "0x7f1c", "0x7f99bb"),
                           2: dump(303, "303", "0x7f00aa", where="train.py:40"), 3: ""})
    assert [g.ranks for g in groups] == [(0, 1), (2,)]  # rank 3 gave nothing
    assert groups[0].text.startswith("Process 101") and "train.py:40" in groups[1].text
    assert groups[0].to_dict()["ranks_text"] == "0-1"
    big = group_native({0: "x" * (3 * MAX_NATIVE_BYTES)})
    assert len(big[0].text) == MAX_NATIVE_BYTES
    many = group_native({r: dump(r, str(r), "0x1", where=f"train.py:{r}") for r in range(40)})
    assert len(many) == MAX_NATIVE_GROUPS
