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
                              "import time; time.sleep(600)"],
                             env={**os.environ, "MESHYARD_PARENT_PID": str(os.getpid())},
                             start_new_session=True)
    print(child.pid, flush=True)
    time.sleep(600)
""")


def test_a_rank_dies_with_the_worker_that_started_it() -> None:
    parent = subprocess.Popen([PY, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        time.sleep(0.5)  # the runner has set its parent-death signal
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
    from workers.rankproc import RankProcess, become_subreaper
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
