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
