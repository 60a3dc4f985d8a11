"""`meshyard.train.get_context().should_stop()`: true once the worker asked the rank to stop
(its stop file exists, or SIGTERM arrived after the first call), and SIGTERM then no longer
ends the process, so the loop can save a checkpoint within the grace period."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from meshyard import _protocol as proto

ROOT = Path(__file__).resolve().parents[3]


def test_the_stop_file_and_sigterm_both_ask_to_stop(tmp_path: Path) -> None:
    stop = proto.stop_path(tmp_path, 3)
    script = textwrap.dedent(f"""
        import os, signal, sys
        from meshyard.train import get_context
        ctx = get_context()
        assert not ctx.should_stop()
        open({str(stop)!r}, "w").close()
        assert ctx.should_stop()
        os.remove({str(stop)!r})
        assert not ctx.should_stop()
        os.kill(os.getpid(), signal.SIGTERM)  # survived: the flag is set instead
        assert ctx.should_stop()
        print("saved and stopped")
    """)
    env = dict(os.environ, **{proto.STOP_FILE: str(stop)}, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "saved and stopped" in out.stdout


def test_sigterms_back_to_back_never_stop_the_loop(tmp_path: Path) -> None:
    """The worker signals a rank's process group and its process tree, so SIGTERM can land
    again while the handler of the first one runs: a handler that takes a lock deadlocks
    there (it did, in about half of these trials, with `threading.Event.set`). Each trial's
    loop must still run to its end and see the stop."""
    import signal
    import time

    script = textwrap.dedent("""
        import time
        from meshyard.train import get_context
        ctx = get_context()
        ctx.should_stop()  # the first call: SIGTERM sets the flag from now on
        print("ready", flush=True)
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            ctx.should_stop()
        print("stopped" if ctx.should_stop() else "not asked", flush=True)
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop(proto.STOP_FILE, None)
    for trial in range(6):
        proc = subprocess.Popen([sys.executable, "-c", script], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            deadline = time.monotonic() + 0.8
            while time.monotonic() < deadline and proc.poll() is None:
                for _ in range(50):
                    os.kill(proc.pid, signal.SIGTERM)
            out, err = proc.communicate(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, (trial, err[-2000:])
        assert out.strip() == "stopped", (trial, out, err[-2000:])
