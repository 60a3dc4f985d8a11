"""`orchestrator.ansi.strip_ansi`: every escape form a capture carries, nothing else."""

from __future__ import annotations

import pytest

from orchestrator.ansi import strip_ansi


@pytest.mark.parametrize("text,clean", [
    ("\t\x1b[4mGPU0\tGPU1\x1b[0m", "\tGPU0\tGPU1"),           # nvidia-smi's underline
    ("\x1b[1;31mNCCL WARN\x1b[m x", "NCCL WARN x"),           # SGR with and without params
    ("\x1b[2K\x1b[1Gline", "line"),                           # erase line, cursor column
    ("\x1b]0;title\x07text", "text"),                         # OSC to BEL
    ("\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\", "link"),     # OSC 8 hyperlink to ST
    ("\x1b(B\x1b[mreset", "reset"),                           # tput sgr0: charset + SGR
    ("\x1b[?1h\x1b=prompt", "prompt"),                        # script(1) keypad modes
    ("\x9b31mC1", "C1"),                                      # 8-bit CSI
    ("^[[36m(Worker pid=1)^[[0m x", "(Worker pid=1) x"),      # caret notation
    ("[36m(Worker pid=1)[0m [1;32mok", "(Worker pid=1) ok"),  # ESC-less residue
    ("cut at the end \x1b", "cut at the end "),               # a lone ESC
])
def test_strips(text: str, clean: str) -> None:
    assert strip_ansi(text) == clean
    assert strip_ansi(clean) == clean


@pytest.mark.parametrize("text", [
    "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_2:1/RoCE", "Trees [0] 1/-1/-1->0->-1",
    "[rank3]:[E1010 12:00:00.1 x]", "[1,3]<stdout>:x", "a\tb\r\n", "[repeated 14x across cluster]",
    "Channel 00/02 :    0   1", "memory_format=(nullopt)))", "NIC0: mlx5_bond_0",
])
def test_leaves_text_alone(text: str) -> None:
    assert strip_ansi(text) == text


def test_linear_on_a_long_run_of_escapes() -> None:
    assert strip_ansi("\x1b[" * 200_000 + "\nx") == "\nx"
    assert strip_ansi("\x1b[" + "1;" * 100_000 + "m") == ""
