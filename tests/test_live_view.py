"""The live view under a real pseudo-terminal (script(1)), read back through a
terminal emulator (pyte): one line per process redrawn in place at the bottom,
output scrolling above it, nothing said twice; --plain and a pipe keep the
prefixed lines (issue #13)."""
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pyte

from supervise import write_config

PAYLOAD = pathlib.Path(__file__).parent / "payloads" / "ctl_step.py"
ROWS, COLS = 60, 120


def three_roles(steps):
    cmd = json.dumps([sys.executable, str(PAYLOAD)])
    return f"""
[[role]]
name = "target"
devices = [0, 1]
command = {cmd}
ready = "notify"
env = {{ STEP_S = "0.3", STEPS = "{steps}" }}

[[role]]
name = "drafter"
devices = [5]
command = {cmd}
ready = "notify"
env = {{ STEP_S = "0.3", STEPS = "{steps}" }}
"""


def run_under_pty(bin_dir, cfg, *args, env=None):
    """The run inside script(1): its stdout is a pty of ROWS x COLS; the raw bytes."""
    cmd = f"stty rows {ROWS} cols {COLS}; exec {shlex.quote(str(bin_dir / 'dflash-launch'))} run " \
          f"{shlex.quote(str(cfg))} --run-id v {' '.join(args)}"
    r = subprocess.run(["script", "-qfec", cmd, "/dev/null"], stdin=subprocess.DEVNULL, capture_output=True,
                       timeout=120, env=env)
    assert r.returncode == 0, r.stdout[-2000:]
    return r.stdout.decode(errors="replace")


def screens(raw):
    """The emulated screen after each chunk of output that ends a frame (the
    last drawn row), and at the end."""
    screen = pyte.Screen(COLS, ROWS)
    stream = pyte.Stream(screen)
    shots = []
    # Every frame starts by erasing the block drawn before: split there, so each
    # piece ends with a whole frame drawn.
    raw = raw.replace("\r\n", "\n").replace("\n", "\r\n")
    for piece in re.split(r"(?=\r(?:\x1b\[\d+A)?\x1b\[J)", raw):
        stream.feed(piece)
        shots.append([l.rstrip() for l in screen.display])
    return shots


def test_live_view_one_line_per_process_redrawn_in_place(bin_dir, tmp_path):
    env = dict(os.environ, TERM="xterm", XDG_RUNTIME_DIR=str(tmp_path))
    env.pop("NO_COLOR", None)
    # --no-dedup: target:0 and target:1 print the same steps, which the console would otherwise say once
    # (tests/test_operable.py); here each process's lines are the subject.
    raw = run_under_pty(bin_dir, write_config(tmp_path, three_roles(steps=8)), "--no-dedup", env=env)
    # Redrawn in place: the cursor goes up over the block (5 lines: 2 headers,
    # 3 processes) and erases it, many times.
    assert raw.count("\x1b[4A\x1b[J") >= 3, raw[-3000:]
    names = ["target:0", "target:1", "drafter:0"]
    # Some screen mid-run: the block is the last lines, one row per process.
    mid = [s for s in screens(raw) if any(l.startswith("-- run v |") for l in s)]
    assert mid, raw[-3000:]
    for shot in mid:
        used = [l for l in shot if l]
        head = next(i for i, l in enumerate(used) if l.startswith("-- run v |"))
        block = used[head:]
        assert block[1].startswith("NAME ") and len(block) == 5, block
        assert sorted(l.split()[0] for l in block[2:]) == sorted(names), block
        assert sum(l.startswith("-- run v |") for l in shot) == 1  # never a second block left behind
    # Some frame shows a STATUS= text in a row.
    assert any(re.search(r"^drafter:0 +RUNNING .* step \d+ loss", l) for s in mid for l in s), mid[-1]
    # The end: the block is gone, each output line is on the screen once and
    # no STATUS= was repeated as a [dflash] line.
    final = screens(raw)[-1]
    assert not any(l.startswith("-- run v |") for l in final), final
    for n in names:
        for k in range(1, 9):
            line = f"[{n}] {n}: step {k} loss {3.0 / k:.3f}"
            assert sum(l.startswith(line) for l in final) == 1, (line, final)
    assert not any(re.match(r"\[dflash\] \S+: step", l) for l in final), final


def test_plain_and_a_pipe_keep_the_prefixed_lines(bin_dir, tmp_path):
    env = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path))
    cfg = write_config(tmp_path, three_roles(steps=3))
    raw = run_under_pty(bin_dir, cfg, "--plain", "--color", "never", "--no-dedup", env=env)  # as above
    assert "\x1b[" not in raw  # no cursor movement, no colour
    piped = subprocess.run([str(bin_dir / "dflash-launch"), "run", str(cfg), "--run-id", "p", "--no-dedup"], env=env,
                           capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0
    assert "\x1b[" not in piped.stdout
    for out in (raw.replace("\r\n", "\n"), piped.stdout):
        lines = out.splitlines()
        # Said once: the payload's own line; its STATUS= (the same text) is
        # held 100 ms for it and then not printed, whichever arrived first.
        for n in ("target:0", "target:1", "drafter:0"):
            for k in (1, 2, 3):
                assert sum(l.startswith(f"[{n}] {n}: step {k} ") for l in lines) == 1, out
        assert not any(re.match(r"\[dflash\] \S+: step", l) for l in lines), out


def test_no_color_keeps_the_view_without_colour(bin_dir, tmp_path):
    env = dict(os.environ, TERM="xterm", NO_COLOR="1", XDG_RUNTIME_DIR=str(tmp_path))
    raw = run_under_pty(bin_dir, write_config(tmp_path, three_roles(steps=4)), env=env)
    assert "\x1b[J" in raw and "-- run v |" in raw  # the view, redrawn in place
    assert not re.search(r"\x1b\[[0-9;]*m", raw), raw[-2000:]  # and not one colour sequence
