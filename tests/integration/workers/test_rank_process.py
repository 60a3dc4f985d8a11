"""A user-code rank process without Ray: `python -m meshyard.runner` reports what went wrong
(and whether the code could not even load), passes exit codes through, dies with its parent;
`RankProcess.terminate` ends the whole tree, a grandchild that left the process group too."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.integration.runtime.usercode_helpers import alive
from tests.support.jobs import until

PY = sys.executable


def _run(tmp: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, list[dict]]:
    report = tmp / "report.jsonl"
    report.unlink(missing_ok=True)
    proc = subprocess.run([PY, "-m", "meshyard.runner", *args], cwd=tmp, capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, "MESHYARD_REPORT_FILE": str(report), **(env or {})})
    records = [json.loads(x) for x in report.read_text().splitlines()] if report.exists() else []
    return proc.returncode, records


def test_errors_are_reported_with_whether_the_code_loaded(tmp_path: Path) -> None:
    (tmp_path / "boom.py").write_text("import meshyard.train as t\nt.report({'loss': 1.5})\n"
                                      "raise ValueError('bad batch')\n")
    (tmp_path / "syntax.py").write_text("def f(:\n")
    (tmp_path / "bye.py").write_text("import sys\nsys.exit(4)\n")
    (tmp_path / "fn.py").write_text("def loop(config):\n    assert config == {}\n")
    rc, recs = _run(tmp_path, "script", "boom.py")
    assert rc == 1 and [r["kind"] for r in recs] == ["report", "error"]
    assert recs[0]["step"] == 1 and recs[0]["metrics"] == {"loss": 1.5}
    assert recs[1]["type"] == "ValueError" and recs[1]["message"] == "bad batch"
    assert recs[1]["setup"] is False and 'boom.py", line 3' in recs[1]["traceback"]
    for args, kind in ((("script", "missing.py"), "FileNotFoundError"),
                       (("script", "syntax.py"), "SyntaxError"),
                       (("function", "trian:loop"), "ModuleNotFoundError"),
                       (("function", "fn:nope"), "AttributeError"),
                       (("module", "no_such_mod"), "ModuleNotFoundError"),
                       (("exec", "/no/such/program"), "FileNotFoundError")):
        rc, recs = _run(tmp_path, *args)
        assert rc == 1 and recs[-1]["setup"] is True and recs[-1]["type"] == kind, (args, recs)
    assert _run(tmp_path, "script", "bye.py") == (4, [])
    assert _run(tmp_path, "function", "fn:loop", env={"PYTHONPATH": str(tmp_path)}) == (0, [])


PARENT = textwrap.dedent("""
    import os, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-m", "meshyard.runner", "code",
                              "import time; print('ready', flush=True); time.sleep(600)"],
                             env={**os.environ, "MESHYARD_PARENT_PID": str(os.getpid())},
                             start_new_session=True)
    print(child.pid, flush=True)
    time.sleep(600)
""")


def test_a_rank_dies_with_the_worker_that_started_it() -> None:
    parent = subprocess.Popen([PY, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        # The runner sets its parent-death signal before it runs the code, which prints this.
        assert parent.stdout.readline().strip() == "ready"
        assert alive(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child)
    finally:
        parent.kill()


ACTOR = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from workers.host.rankproc import RankProcess, become_subreaper
    out = Path(sys.argv[1])
    assert become_subreaper()
    script = out / "tree.py"
    script.write_text('''
    import os, subprocess, sys, time
    from pathlib import Path
    a = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    b = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                         start_new_session=True)  # escapes the process group
    Path(sys.argv[1]).write_text(f"{os.getpid()} {a.pid} {b.pid}")
    time.sleep(600)
    ''')
    proc = RankProcess([sys.executable, "-m", "meshyard.runner", "script", str(script),
                        str(out / "pids")], env=dict(__import__("os").environ),
                       cwd=str(out)).start()
    while not (out / "pids").exists():
        time.sleep(0.05)
    time.sleep(0.3)
    t0 = time.monotonic()
    proc.terminate(grace_s=1.0)
    print(json.dumps({"rc": proc.poll(), "s": time.monotonic() - t0}))
""")


def test_terminate_ends_the_whole_tree_even_a_new_session(tmp_path: Path) -> None:
    done = subprocess.run([PY, "-c", ACTOR, str(tmp_path)], capture_output=True, text=True,
                          timeout=120, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["rc"] == -signal.SIGTERM  # the rank got SIGTERM first
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    assert len(pids) == 3 and [p for p in pids if alive(p)] == []


@pytest.mark.parametrize("mode", ["script", "module"])
def test_argv_and_sys_path_match_plain_python(tmp_path: Path, mode: str) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    body = "import sys, json; print(json.dumps({'argv': sys.argv, 'name': __name__}))\n"
    (pkg / "main.py").write_text(body)
    target = "pkg/main.py" if mode == "script" else "pkg.main"
    flag = [] if mode == "script" else ["-m"]
    plain = subprocess.run([PY, *flag, target, "a", "--b"], cwd=tmp_path, capture_output=True,
                           text=True, check=True, timeout=60)
    ours = subprocess.run([PY, "-m", "meshyard.runner", mode, target, "a", "--b"], cwd=tmp_path,
                          capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(ours.stdout) == json.loads(plain.stdout)


SEES = textwrap.dedent("""
    import json, os, sys
    import meshyard.train as t
    print("to stdout"); print("to stderr", file=sys.stderr)
    out = {"argv": sys.argv, "cwd": os.getcwd(), "env": dict(os.environ),
           "path0": sys.path[0], "code_on_path": os.environ["CODE"] in sys.path,
           "stdin": sys.stdin.read(), "user_mod": "helper" in sys.modules,
           "threads": __import__("torch").get_num_threads(), "main": __name__,
           "cmdline": open("/proc/self/cmdline").read().split("\\0")}
    import helper
    out["helper"] = helper.VALUE
    open(os.environ["OUT"], "w").write(json.dumps(out))
    t.report({"loss": 0.5})
    sys.exit(3)
""")


def test_a_prestarted_rank_runs_the_script_as_a_cold_start_would(tmp_path: Path) -> None:
    """The pooled actor's prestarted process (meshyard/_prestart.py) becomes the same rank a
    cold `python -m meshyard.runner` would: argv, cwd, exactly the rank's environment (none of
    the one it was started with), sys.path, stdin, stdout / stderr in the rank's log files,
    torch's threads, the report and the exit code."""
    from workers.host.rankproc import PrestartedRank, RankProcess

    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(SEES)
    (code / "helper.py").write_text("VALUE = 7\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("MESHYARD_", "OMP_"))}
    seen = {}
    for how in ("cold", "prestarted"):
        run = tmp_path / how
        run.mkdir()
        env = {**base, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(code), "CODE": str(code),
               "OUT": str(run / "out.json"), "MESHYARD_REPORT_FILE": str(run / "report.jsonl"),
               "OMP_NUM_THREADS": "1", "JOB_SECRET_OF_THIS_JOB": "s3"}
        argv = [PY, "-m", "meshyard.runner", "script", "train.py", "--lr", "1"]
        if how == "cold":
            with open(run / "rank.stdout", "ab") as out, open(run / "rank.stderr", "ab") as err:
                proc = subprocess.Popen(argv, env=env, cwd=code, stdin=subprocess.DEVNULL,
                                        stdout=out, stderr=err, start_new_session=True)
            rp = RankProcess.adopt(proc, argv, env=env, cwd=str(code))
        else:
            pre = PrestartedRank.spawn(python=PY, env={**base, "SPAWN_ONLY": "x"},
                                       cwd=str(tmp_path))
            assert pre.wait_ready()
            assert not pre.fits([PY, "-u", *argv[1:]], env)  # interpreter options: cold
            assert not pre.fits(argv, {**env, "PYTHONHASHSEED": "1"})  # start-up variable
            pid = pre.pid
            got = pre.hand(argv, env=env, cwd=str(code), stdout=run / "rank.stdout",
                           stderr=run / "rank.stderr")
            assert got is not None and got.pid == pid
            rp = got
        assert rp.wait(120) == 3
        seen[how] = json.loads((run / "out.json").read_text())
        assert (run / "rank.stdout").read_text() == "to stdout\n"
        assert (run / "rank.stderr").read_text() == "to stderr\n"
        recs = [json.loads(x) for x in (run / "report.jsonl").read_text().splitlines()]
        assert [(r["kind"], r["step"], r["metrics"]) for r in recs] == [("report", 1,
                                                                          {"loss": 0.5})]
    cold, warm = seen["cold"], seen["prestarted"]
    assert "SPAWN_ONLY" not in warm["env"]
    for key in ("OUT", "MESHYARD_REPORT_FILE"):
        cold["env"].pop(key), warm["env"].pop(key)
    assert warm["env"] == cold["env"]
    assert warm["cmdline"][:3] == [PY, "-m", "meshyard._prestart"]  # it was the warm path
    for k in ("argv", "cwd", "path0", "code_on_path", "stdin", "user_mod", "threads", "main",
              "helper"):
        assert warm[k] == cold[k], k
    assert cold["threads"] == 1 and cold["argv"] == ["train.py", "--lr", "1"]


@pytest.mark.parametrize("own_session", [False, True], ids=["same-group", "own-session"])
def test_ending_a_process_of_the_actor_spares_a_prestarted_rank_still_waiting(
        tmp_path: Path, own_session: bool) -> None:
    """A rank process's end kills every descendant of the actor (what a script left running,
    also in a session of its own, out of the rank's process group), but not the prestarted
    process waiting for the next rank (a pooled actor's, or the one the next rank's
    pre-flight check runs in before it becomes that rank)."""
    from workers.host.rankproc import PrestartedRank, RankProcess

    base = {k: v for k, v in os.environ.items() if not k.startswith(("MESHYARD_", "OMP_"))}
    pre = PrestartedRank.spawn(python=PY, env=base, cwd=str(tmp_path))
    try:
        assert pre.wait_ready()
        other = RankProcess([PY, "-c", "import subprocess, sys, time; subprocess.Popen("
                             "[sys.executable, '-c', 'import time; time.sleep(60)'], "
                             f"start_new_session={own_session}); "
                             "time.sleep(60)"], env=base, cwd=str(tmp_path)).start()
        # the other's own child, once it has started it (a bounded wait, not a fixed sleep);
        # read below the other, not as whatever else this process has below it: a process
        # an earlier test started may still be ending there
        left = until(lambda: _children_of(other.pid),
                     timeout_s=60, what="the other rank's child", poll_s=0.05)
        assert pre.pid not in left
        other.kill_tree()
        assert other.poll() is not None and pre.pid is not None and alive(pre.pid)
        # the other's own child did not survive (SIGKILL's end is not instant on a loaded host)
        until(lambda: not [p for p in left if alive(p)], timeout_s=30,
              what=f"the other rank's child {left} to end after kill_tree", poll_s=0.05)
        out = tmp_path / "out"
        out.mkdir()
        env = {**base, "PYTHONUNBUFFERED": "1", "MESHYARD_REPORT_FILE": str(out / "r.jsonl")}
        (tmp_path / "t.py").write_text("print('ran')\n")
        rank = pre.hand([PY, "-m", "meshyard.runner", "script", "t.py"], env=env,
                        cwd=str(tmp_path), stdout=out / "o", stderr=out / "e")
        assert rank is not None and rank.wait(60) == 0
        assert (out / "o").read_text() == "ran\n"
    finally:
        pre.close()


def test_a_prestarted_rank_that_died_on_its_own_is_spared_no_more(tmp_path: Path) -> None:
    """Once a waiting prestarted process has ended by itself, its pid is free for any other
    process (a script's child): a rank's end must not spare that one."""
    from workers.host.rankproc import PrestartedRank, _spared

    base = {k: v for k, v in os.environ.items() if not k.startswith(("MESHYARD_", "OMP_"))}
    pre = PrestartedRank.spawn(python=PY, env=base, cwd=str(tmp_path))
    try:
        assert pre.pid is not None and pre.pid in _spared()
        os.kill(pre.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while pre.pid in _spared():
            assert time.monotonic() < deadline, "a dead prestarted process is still spared"
            time.sleep(0.05)
    finally:
        pre.close()


def _children_of(pid: int) -> list[int]:
    from workers.host.rankproc import descendants

    return sorted(descendants(pid))


SHADOWED = textwrap.dedent("""
    import json, os, pickle, sys
    before = sorted(m for m in sys.modules if m.partition(".")[0] in
                    ("api", "orchestrator", "workers", "pydantic"))
    import orchestrator, workers
    import torch, torch.distributed as dist
    fresh = not dist.is_initialized()
    dist.init_process_group("gloo")
    for _ in range(2):
        dist.all_reduce(torch.ones(4))
    fr = pickle.loads(torch._C._distributed_c10d._dump_fr_trace())
    dist.destroy_process_group()
    json.dump({"pid": os.getpid(), "workers": workers.OWNER, "orchestrator": orchestrator.OWNER,
               "before": before, "fresh": fresh, "fr_status": sorted(fr.get("pg_status") or {}),
               "fr_seqs": [(e["process_group"][0], e["collective_seq_id"])
                           for e in fr.get("entries") or ()],
               "cmdline": open("/proc/self/cmdline").read().split("\\0")},
              open(os.environ["OUT"], "w"))
""")


def _user_packages(where: Path, owner: str) -> None:
    for pkg in ("workers", "orchestrator"):
        (where / pkg).mkdir(parents=True)
        (where / pkg / "__init__.py").write_text(f"OWNER = {owner!r}\n")


# One rank of a user-code job started as its worker actor starts it (run_user_rank), in a
# process of its own as an actor is: what that process imported is the actor's cost.
ONE_RANK = textwrap.dedent("""
    import json, sys, threading
    from orchestrator.spec import parse_spec
    from workers.host.assignment import DistEnv, RankAssignment
    from workers.usercode.rank import run_user_rank

    code, actor_cwd, run, r, port, master = sys.argv[1:7]
    r, port, master = int(r), int(port), int(master)

    class Sink:
        heartbeat = last_step = None

        def __init__(self):
            self.lines = []

        def metric(self, row):
            pass

        def log(self, stream, line):
            self.lines.append(line)

    spec = parse_spec({"name": "pf", "parallelism": {"dp_replicate": 2},
                       "resources": {"device": "cpu"},
                       "entrypoint": {"command": ["python", "train.py"], "working_dir": code,
                                      "env": {"OUT": f"{run}/out-{r}.json"}}})
    a = RankAssignment(job_id="pf", attempt=1, rank=r, spec=spec, run_dir=run,
                       log_dir=f"{run}/logs", preflight_port=port,
                       dist=DistEnv(rank=r, local_rank=r, world_size=2, local_world_size=2,
                                    master_addr="127.0.0.1", master_port=master))
    assert a.runs_user_preflight
    sink = Sink()
    result = run_user_rank(a, sink=sink, stop=threading.Event(), actor_cwd=actor_cwd)
    print(json.dumps({"state": str(result.state), "message": result.message, "log": sink.lines,
                      "torch": "torch" in sys.modules}))
""")


def test_the_preflight_check_runs_in_the_process_that_then_becomes_the_rank(
        tmp_path: Path) -> None:
    """A 2-rank user-code job started as its worker actors start it (run_user_rank, no pooled
    process): each rank's check runs in a child forked from a process that imported torch
    once and then becomes the rank (the rank's code runs in that same process), the worker
    side imports no torch, the rank's process holds nothing of the check's (no module of
    meshyard's control plane, process group, group id or Flight Recorder entry: the user's
    own packages named `workers` and `orchestrator` import, its recorder starts at seq 1 of
    group "0"), and neither the worker's directory nor the code directory is on the check's
    import path, though both are on the worker's (a `workers` package in the worker's
    directory raises on import; the user's has no `workers.host.preflight`)."""
    from workers.host.env import free_port

    code, actor_cwd, run = tmp_path / "code", tmp_path / "actor", tmp_path / "run"
    _user_packages(code, "user's own")
    (code / "train.py").write_text(SHADOWED)
    (actor_cwd / "workers").mkdir(parents=True)
    (actor_cwd / "workers" / "__init__.py").write_text("raise ImportError('planted')\n")
    run.mkdir()
    repo = str(Path(__file__).resolve().parents[3])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MESHYARD_", "OMP_"))}
    # the worker's path has its own directory and the code first, as Ray's working_dir gives
    env["PYTHONPATH"] = os.pathsep.join([str(actor_cwd), str(code), repo])
    ports = [str(free_port()), str(free_port())]
    workers = [subprocess.Popen([PY, "-c", ONE_RANK, str(code), str(actor_cwd), str(run), str(r),
                                 *ports], env=env, cwd=repo, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    for r, w in enumerate(workers):
        out, err = w.communicate(timeout=300)
        assert w.returncode == 0, err[-3000:]
        rank = json.loads(out.strip().splitlines()[-1])
        assert rank["torch"] is False  # the worker's side: the check ran in the rank's process
        assert rank["state"] == "completed", rank
        assert any("pre-flight check passed" in x and "forked from the rank's process" in x
                   for x in rank["log"]), rank["log"]
        seen = json.loads((run / f"out-{r}.json").read_text())
        assert seen["cmdline"][:4] == [PY, "-m", "meshyard._prestart", "--without-dynamo"]
        assert (seen["workers"], seen["orchestrator"]) == ("user's own", "user's own")
        # nothing of the check's: no module, process group, group id or recorder entry
        assert seen["before"] == [] and seen["fresh"] is True
        assert seen["fr_status"] == ["0"] and seen["fr_seqs"] == [["0", 1], ["0", 2]]
