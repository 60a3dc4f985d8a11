"""Terminal escape sequences out of text: `strip_ansi` for input every text parser reads,
`strip_controls` for text a rank wrote before it reaches a user's terminal.

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

`strip_controls` is stricter, for output: a terminal acts on more than colours. An OSC 52
sequence writes the user's clipboard, OSC 0 sets the window title, DCS / APC / PM / SOS
strings reach the terminal's own handlers, cursor moves and a bare CR or backspaces overwrite
what is shown (a line that hides the one before it), and the 8-bit forms (U+009B CSI, U+009D
OSC, ...) do the same on terminals that honour them. It removes every escape sequence with its
whole payload, and every C0 and C1 control character but tab and newline.

    >>> strip_controls("ok\x1b]52;c;cm0gLXJmIH4=\x07\rrank 0: fine\x9b2J")
    'okrank 0: fine'
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


# What a terminal acts on. Control strings (DCS, OSC, SOS, PM, APC, 7- and 8-bit) run to BEL
# or ST, or, cut short, to the end of the line; then CSI; then the other escapes; then any C0
# or C1 control left (tab and newline excepted), DEL included.
_CONTROL_RE = re.compile(
    r"(?:\x1b[P\]X^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c\n]*(?:\x07|\x1b\\|\x9c)?"
    r"|(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    r"|\x1b[ -/]*[0-~]"
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"
)


def strip_controls(text: str) -> str:
    """`text` as safe to print to a terminal (see the module docstring)."""
    return _CONTROL_RE.sub("", text)
