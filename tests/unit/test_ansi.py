"""`orchestrator.text.ansi.strip_ansi`: every escape form a capture carries, nothing else."""

from __future__ import annotations

import pytest

from orchestrator.text.ansi import strip_ansi, strip_controls


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


HOSTILE = [
    ("\x1b]52;c;cm0gLXJmIH4K\x07after", "after"),             # OSC 52: write the clipboard
    ("\x1b]52;c;cm0gLXJmIH4K\x1b\\after", "after"),           # ... ended by ST
    ("\x1b]0;owned\x07title", "title"),                        # set the window title
    ("\x9d0;owned\x9ctitle", "title"),                         # 8-bit OSC to 8-bit ST
    ("\x1b]2;cut short", ""),                                  # an OSC never ended
    ("\x1bP+q544e\x1b\\dcs", "dcs"),                           # DCS (XTGETTCAP) with payload
    ("\x90payload\x9cdcs", "dcs"),                             # 8-bit DCS
    ("\x1b_apc\x1b\\\x1b^pm\x1b\\\x1bXsos\x1b\\x", "x"),       # APC, PM, SOS strings
    ("\x1b[2J\x1b[H\x1b[1;1Hhome", "home"),                    # clear screen, cursor moves
    ("\x1b[1A\x1b[2Kup", "up"),                                # up a line, erase it
    ("\x9b2J\x9b1;1Hc1", "c1"),                                # 8-bit CSI
    ("\x1b7\x1b8\x1bc\x1b(0x", "x"),                           # save/restore, reset, charset
    ("all good\rrank 1 OOM", "all goodrank 1 OOM"),            # a bare CR overwrite
    ("secret\x08\x08\x08\x08\x08\x08public", "secretpublic"),  # backspaces over a word
    ("bell\x07 nul\x00 del\x7f vt\x0b ff\x0c", "bell nul del vt ff"),
    ("line one\r\n", "line one\n"),                            # CRLF keeps its newline
]


@pytest.mark.parametrize(("text", "shown"), HOSTILE)
def test_strip_controls_leaves_nothing_a_terminal_acts_on(text: str, shown: str) -> None:
    out = strip_controls(text)
    assert out == shown
    assert not any(ord(c) < 0x20 and c not in "\t\n" or 0x7f <= ord(c) <= 0x9f for c in out)


def test_strip_controls_keeps_plain_text_tabs_and_newlines() -> None:
    text = "step 3\tloss 2.5 [rank 0] é ✓ 日本\nnext [36m"
    assert strip_controls(text) == text
