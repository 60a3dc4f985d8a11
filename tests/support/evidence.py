"""What a diagnosis round leaves in a job's run dir (orchestrator/watchdog/evidence_files.py):
the periodic straggler probe's folder and the folders of hang rounds."""

from __future__ import annotations

from pathlib import Path

PROBE = "straggler-probe"


def assert_probe_without_native(run: Path, *, world: int) -> None:
    """The straggler probe read every rank's collectives and stacks and took no py-spy dump
    (which stops a rank while it reads it)."""
    probe = run / "diagnostics" / PROBE
    for r in range(world):
        assert (probe / f"rank{r}" / "fr_trace.pkl").is_file(), sorted(probe.rglob("*"))
        assert (probe / f"rank{r}" / "stacks.txt").is_file()
        assert not (probe / f"rank{r}" / "pyspy.txt").exists()


def assert_hang_round_with_native(run: Path, ranks: list[int]) -> None:
    """A hang round (not the probe) holds py-spy's native stacks of each of `ranks` (py-spy
    is a test dependency)."""
    rounds = [d for d in (run / "diagnostics").iterdir()
              if d.is_dir() and d.name not in (PROBE, "live")]
    assert rounds, sorted(p.name for p in (run / "diagnostics").iterdir())
    for r in ranks:
        dumps = [d / f"rank{r}" / "pyspy.txt" for d in rounds]
        assert any(p.is_file() and "Thread " in p.read_text() for p in dumps), (r, rounds)
