"""Terminal escape sequences out of input text: the one helper every text parser calls first.

Pure module (stdlib only). Text reaches meshyard from terminals, `script` captures, log
shippers and issue trackers: `nvidia-smi topo -m` underlines its header (`ESC[4m ... ESC[0m`),
loggers colour their prefixes, and a copy through a web page drops the ESC byte and leaves
the residue (`[36m`) or shows it in caret notation (`^[[36m`). `strip_ansi` removes all of
these in two linear passes and leaves everything else as it was (tabs, CR, the order of the
remaining characters).

    >>> strip_ansi("\\x1b[4m\\tGPU0\\tGPU1\\x1b[0m")
    '\\tGPU0\\tGPU1'
    >>> strip_ansi("[36m(RayTrainWorker pid=12)[0m hello")
    '(RayTrainWorker pid=12) hello'
"""

from __future__ import annotations

import re

_ESC_RE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"            # CSI: colours, underline, cursor moves (ESC[4m)
    r"|\x9b[0-?]*[ -/]*[@-~]"             # the same with the 8-bit CSI byte
    r"|\x1b\][^\x07\x1b\n]*(?:\x07|\x1b\\)?"  # OSC (window titles, hyperlinks) to BEL / ST
    r"|\x1b[ -/]+[0-~]"                   # nF: character-set selection (ESC(B from tput)
    r"|\x1b[0-~]"                         # two-byte sequences (ESC=, ESC>, ESC7, ESC c)
    r"|\^\[\[[0-9;]*[A-Za-z]"             # caret notation from `cat -v` / less: ^[[4m
    r"|\x1b"                              # a lone ESC left by a cut sequence
)
# SGR residue when the ESC byte was lost ("[36m"); a second pass, so a residue that real
# sequences were written into ("[3" ESC[0m "6m") is removed too.
_RESIDUE_RE = re.compile(r"\[[0-9]{1,3}(?:;[0-9]{1,3}){0,4}m")


def strip_ansi(text: str) -> str:
    """`text` without terminal escape sequences (see the module docstring)."""
    return _RESIDUE_RE.sub("", _ESC_RE.sub("", text))
