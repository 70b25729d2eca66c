"""The ring of reused frame files (issue #49, item 2; spool/spool_ring.h, through the C ABI): an acknowledged frame's file
goes back to its producer and the next frame is written over it, the consumer reading it through the mapping it
kept. Every promise of the spool holds through it: values (never an earlier frame's, never a write of the
trainer's), a view kept past its ack, the byte budget, a finished producer, a kill between the ring's renames or
in the middle of a write over a reused file, a filesystem without RENAME_EXCHANGE. The kills and the missing kernel
features are injected where the library meets the kernel (tests/spool_faults.c, LD_PRELOADed into a child)."""
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import ROOT
from test_spool import ENV, SMALL_ENV

sys.path.insert(0, str(ROOT / "python"))
from dflash_launch import contract_from_env  # noqa: E402
from dflash_launch.spool import SpoolProducer, SpoolSource, frame_file, manifest, spool_bytes  # noqa: E402

# Frames of ~300 KB: the ring takes files from 256 KiB (spool_ring.h kRingMinBytes) on.
RING_ENV = dict(SMALL_ENV, DFLASH_HIDDEN_SHAPE="1,32,2400", DFLASH_HIDDEN="800")
CONTRACT = contract_from_env(RING_ENV)
SMALL = contract_from_env(SMALL_ENV)


def frame(seq, width=2400):
    g = torch.Generator().manual_seed(seq)
    return torch.randn(1, 32, width, generator=g), torch.randint(0, 63, (1, 32), generator=g)


def ino(path):
    return os.stat(path).st_ino


@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    """tests/spool_faults.c built: the LD_PRELOAD that injects a fault at a system call (its header says which)."""
    out = tmp_path_factory.mktemp("faults") / "spool_faults.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(out), str(ROOT / "tests" / "spool_faults.c"), "-ldl"],
                   check=True, timeout=120)
    return str(out)


def run_faulty(script, root, faults, expect, **fault_env):
    """`script` (formatted with python, root) in a child with `faults` preloaded and `fault_env` set."""
    r = subprocess.run([sys.executable, "-c", script.format(python=str(ROOT / "python"), root=str(root))],
                       env=dict(ENV, **RING_ENV, LD_PRELOAD=faults, **fault_env), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == expect, (r.returncode, r.stdout, r.stderr)
    return r.stdout


def consume(src, want_seq, still_viewed=0, scribble=None, width=2400):
    """One sample: its values are frame(want_seq)'s; `scribble(sample)` (a trainer's in-place ops), then
    acknowledged, its views dropped, its release done (but for `still_viewed` earlier frames a test keeps a view
    of)."""
    s = src.next_sample()
    hidden, tokens = frame(want_seq, width)
    assert s["seq"] == want_seq and torch.equal(s["hidden"], hidden) and torch.equal(s["tokens"], tokens)
    if scribble:
        scribble(s)
    s["ack"]()
    del s
    assert src.release() == still_viewed


def test_an_acknowledged_file_is_written_over_by_the_next_frame_and_read_through_the_kept_mapping(tmp_path):
    root = tmp_path / "spool"
    p = SpoolProducer(root, "t:0", CONTRACT, producers=1)
    src = SpoolSource(root, "d:0", CONTRACT, producers=1)
    p.publish(*frame(0))
    first = ino(root / "ready" / frame_file("t:0", 0))
    consume(src, 0)
    assert os.listdir(root / "free") == [frame_file("t:0", 0)] and ino(root / "free" / frame_file("t:0", 0)) == first
    assert os.path.getsize(root / "done" / frame_file("t:0", 0)) == 0  # the record, as before the ring
    for seq in range(1, 5):
        p.publish(*frame(seq))
        assert os.listdir(root / "free") == [] and ino(root / "ready" / frame_file("t:0", seq)) == first
        consume(src, seq)
    assert src.stats()["mappings_reused"] == 4
    p.finish()
    assert src.next_sample() is None and os.listdir(root / "free") == []
    m, final = manifest(root, 1)
    assert final and m["exactly_once"] and m["frames_consumed"] == 5, m


def test_a_write_to_a_view_never_shows_in_a_later_frame_written_over_its_file(tmp_path):
    """The trainer's in-place ops copy pages for its process (MAP_PRIVATE); the kept mapping drops those copies
    before a later frame is read through it, so the later frame's values are the file's, every one."""
    root = tmp_path / "spool"
    p = SpoolProducer(root, "t:0", CONTRACT, producers=1)
    src = SpoolSource(root, "d:0", CONTRACT, producers=1)
    def every_page(s):
        s["hidden"].mul_(0).add_(7)

    def one_word(s):
        s["tokens"][0, 3] = 1
        s["hidden"][0, 5, 7] = -1.0
    for seq in range(4):
        p.publish(*frame(seq))
        consume(src, seq, scribble=one_word if seq % 2 else every_page)
    assert src.stats()["mappings_reused"] == 3
    p.finish()
    assert src.next_sample() is None


def test_a_view_kept_past_its_ack_keeps_the_file_out_of_the_ring_until_it_dies(tmp_path):
    root = tmp_path / "spool"
    p = SpoolProducer(root, "t:0", CONTRACT, producers=1)
    src = SpoolSource(root, "d:0", CONTRACT, producers=1)
    p.publish(*frame(0))
    s = src.next_sample()
    kept = s["hidden"][0, 1:3]
    s["ack"]()
    del s
    src.release()
    assert os.listdir(root / "free") == []  # still mapped by `kept`: not handed back
    p.publish(*frame(1))                    # so this frame is a new file
    consume(src, 1, still_viewed=1)
    assert torch.equal(kept, frame(0)[0][0, 1:3])  # the producer wrote nothing over it
    assert os.listdir(root / "free") == [frame_file("t:0", 1)]
    del kept
    assert src.release() == 0
    assert sorted(os.listdir(root / "free")) == [frame_file("t:0", 0), frame_file("t:0", 1)]


def plant(root, files):
    for name, size in files:
        with open(root / "free" / name, "wb") as f:
            f.write(b"x" * size)
    return {name: ino(root / "free" / name) for name, _ in files}


def test_the_rings_files_count_in_the_byte_budget_and_give_way_to_a_larger_frame(tmp_path):
    K = 1024
    BIG = contract_from_env(dict(RING_ENV, DFLASH_HIDDEN_SHAPE="1,32,7200", DFLASH_HIDDEN="2400"))  # ~0.9 MB
    root = tmp_path / "spool"
    p = SpoolProducer(root, "t:0", CONTRACT, producers=1, max_ready=10)
    planted = plant(root, [(frame_file("t:0", 100), 400 * K), (frame_file("t:0", 101), 700 * K),
                           (frame_file("t:1", 0), 4 * K)])  # another producer's: not ours to count or take
    assert spool_bytes(root, "t:0") == 1100 * K
    # A frame goes over the file that holds it best: the smallest that fits.
    p.publish(*frame(0))
    assert ino(root / "ready" / frame_file("t:0", 0)) == planted[frame_file("t:0", 100)]
    # A larger frame than either file, in a budget they fill: the other file goes to make room, the larger reused.
    root2 = tmp_path / "spool2"
    q = SpoolProducer(root2, "t:0", BIG, producers=1, max_bytes=1200 * K)
    planted = plant(root2, [(frame_file("t:0", 100), 400 * K), (frame_file("t:0", 101), 700 * K),
                            (frame_file("t:1", 0), 4 * K)])
    q.publish(*frame(0, width=7200))
    assert ino(root2 / "ready" / frame_file("t:0", 0)) == planted[frame_file("t:0", 101)]
    assert os.listdir(root2 / "free") == [frame_file("t:1", 0)]
    # A frame under the ring's minimum is never written over a file of it; one that stands in its way goes.
    root3 = tmp_path / "spool3"
    r = SpoolProducer(root3, "t:0", SMALL, producers=1, max_bytes=700 * K)
    plant(root3, [(frame_file("t:0", 100), 600 * K)])
    r.publish(*frame(0, width=96))
    assert spool_bytes(root3, "t:0") > 600 * K and os.listdir(root3 / "free") == [frame_file("t:0", 100)]
    r = SpoolProducer(root3, "t:0", SMALL, producers=1, max_bytes=615 * K)
    r.publish(*frame(1, width=96))
    assert os.listdir(root3 / "free") == [] and spool_bytes(root3, "t:0") < 100 * K
    # A producer whose share the ring holds still publishes, over its files, and stays within it.
    size = 32 * 2400 * 4 + 32 * 8 + 4096  # a frame's allocated bytes, header included
    q = SpoolProducer(tmp_path / "s2", "t:0", CONTRACT, producers=1, max_bytes=3 * size)
    src = SpoolSource(tmp_path / "s2", "d:0", CONTRACT, producers=1)
    for seq in range(6):
        q.publish(*frame(seq))
        assert spool_bytes(tmp_path / "s2", "t:0") <= 3 * size
        consume(src, seq)
    assert len(os.listdir(tmp_path / "s2" / "free")) == 1


def test_a_finished_producer_takes_nothing_back(tmp_path):
    root = tmp_path / "spool"
    p = SpoolProducer(root, "t:0", CONTRACT, producers=1)
    src = SpoolSource(root, "d:0", CONTRACT, producers=1)
    for seq in range(3):
        p.publish(*frame(seq))
    consume(src, 0)
    assert os.listdir(root / "free") == [frame_file("t:0", 0)]
    p.finish()  # drops its files in free/
    assert os.listdir(root / "free") == []
    consume(src, 1)
    consume(src, 2)  # acknowledged after the end: truncated, as before the ring
    assert os.listdir(root / "free") == []
    assert [os.path.getsize(root / "done" / frame_file("t:0", s)) for s in range(3)] == [0, 0, 0]
    m, final = manifest(root, 1)
    assert final and m["exactly_once"], m


def test_a_frame_under_the_rings_minimum_is_truncated_at_its_ack_as_before(tmp_path):
    """The demo's frames (12 KB here): a few pages cost less than the ring's renames, so no file is reused and no
    mapping kept."""
    root = tmp_path / "spool"
    p = SpoolProducer(root, "t:0", SMALL, producers=1)
    src = SpoolSource(root, "d:0", SMALL, producers=1)
    for seq in range(3):
        p.publish(*frame(seq, width=96))
        consume(src, seq, width=96)
        assert os.listdir(root / "free") == [] and os.path.getsize(root / "done" / frame_file("t:0", seq)) == 0
    assert src.stats()["mappings_reused"] == 0


@pytest.mark.parametrize("ring_on", [True, False])
def test_a_checkpoints_commit_hands_its_own_unviewed_frames_to_the_ring(tmp_path, monkeypatch, ring_on):
    """A checkpointing consumer's frames wait in pending/ until a checkpoint commits them; then the committing
    consumer's own frames that no view maps go to the ring. One it still views, and another consumer's (a rank
    of another process may hold its views), are unlinked as before; DFLASH_SPOOL_RING=0 takes none."""
    if not ring_on:
        monkeypatch.setenv("DFLASH_SPOOL_RING", "0")
    root = tmp_path / "spool"
    p = SpoolProducer(root, "t:0", CONTRACT, producers=1)
    a, b = (SpoolSource(root, f"d:{i}", CONTRACT, producers=1) for i in range(2))
    a.hold_for_checkpoint()
    b.hold_for_checkpoint()
    for seq in range(3):
        p.publish(*frame(seq))
    inodes = [ino(root / "ready" / frame_file("t:0", seq)) for seq in range(3)]
    consume(a, 0)
    s = a.next_sample()
    kept = s["hidden"]  # a view of frame 1 past its ack
    s["ack"]()
    del s
    consume(b, 2)
    assert a.commit({"d:0": 2, "d:1": 1}, "ck-1") == 3
    assert os.listdir(root / "pending" / "d:0") == [] and os.listdir(root / "pending" / "d:1") == []
    assert sorted(os.listdir(root / "free")) == ([frame_file("t:0", 0)] if ring_on else [])
    p.publish(*frame(3))
    assert (ino(root / "ready" / frame_file("t:0", 3)) == inodes[0]) == ring_on
    assert torch.equal(kept, frame(1)[0])  # its file unlinked, never written over
    p.finish()
    consume(b, 3, still_viewed=0)
    del kept
    m, final = manifest(root, 1)
    assert m["exactly_once"] is False and m["pending"] == 1  # frame 3 waits for b's next checkpoint
    b.commit({"d:1": 2}, "ck-2")
    m, final = manifest(root, 1)
    assert final and m["exactly_once"] and m["committed_by_checkpoint"] == {"ck-1": 3, "ck-2": 1}, m


CONSUME_THREE = """
import os, sys, torch
sys.path.insert(0, {python!r})
from dflash_launch import contract_from_env
from dflash_launch.spool import SpoolSource
src = SpoolSource({root!r}, "d:0", contract_from_env(), producers=1)
for seq in range(3):
    s = src.next_sample()
    g = torch.Generator().manual_seed(seq)
    assert s["seq"] == seq and torch.equal(s["hidden"], torch.randn(1, 32, 2400, generator=g)), seq
    s["hidden"].add_(1)  # a trainer's in-place op
    s["ack"]()
    del s
    src.release()
    print(len(os.listdir(os.path.join({root!r}, "free"))), os.listdir(os.path.join({root!r}, "tmp")),
          os.path.getsize(os.path.join({root!r}, "done", f"t:0-{{seq:010d}}.safetensors")))
print(src.stats()["mappings_reused"])
"""


def test_without_rename_exchange_the_ack_truncates_as_before(tmp_path, faults):
    root = tmp_path / "spool"
    p = SpoolProducer(root, "t:0", CONTRACT, producers=1)
    for seq in range(3):
        p.publish(*frame(seq))
    out = run_faulty(CONSUME_THREE, root, faults, 0, DFI_NO_EXCHANGE="1").split("\n")
    assert out[:3] == ["0 [] 0"] * 3 and out[3] == "0", out  # nothing handed back, every ack truncated


KILLED_IN_RECYCLE = """
import os, signal, sys, torch
sys.path.insert(0, {python!r})
from dflash_launch import contract_from_env
from dflash_launch.spool import SpoolSource
src = SpoolSource({root!r}, "d:0", contract_from_env(), producers=1)
s = src.next_sample()
s["ack"]()
del s
src.release()
"""

KILLED_MID_WRITE = """
import os, signal, sys, torch
sys.path.insert(0, {python!r})
from dflash_launch import contract_from_env
from dflash_launch.spool import SpoolProducer
g = torch.Generator().manual_seed(1)
SpoolProducer({root!r}, "t:0", contract_from_env(), producers=1).publish(torch.randn(1, 32, 2400, generator=g),
                                                                        torch.randint(0, 63, (1, 32), generator=g))
"""


def test_a_consumer_killed_between_the_rings_renames_loses_nothing(tmp_path, faults):
    root = tmp_path / "spool"
    p = SpoolProducer(root, "t:0", CONTRACT, producers=1)
    p.publish(*frame(0))
    run_faulty(KILLED_IN_RECYCLE, root, faults, -9, DFI_KILL_RENAME_INTO="/free/")  # after the exchange
    f0 = frame_file("t:0", 0)
    # The acknowledgement is whole (done/ has the empty record); the bytes wait in tmp/ for a cleanup.
    assert os.path.getsize(root / "done" / f0) == 0 and os.path.getsize(root / "tmp" / (f0 + ".tmp")) > 0
    src = SpoolSource(root, "d:0", CONTRACT, producers=1)  # its start removes them
    assert os.listdir(root / "tmp") == []
    p.publish(*frame(1))
    consume(src, 1)
    p.finish()
    assert src.next_sample() is None
    m, final = manifest(root, 1)
    assert final and m["exactly_once"] and m["frames_consumed"] == 2, m


def test_a_producer_killed_while_writing_over_a_reused_file_loses_nothing(tmp_path, faults):
    root = tmp_path / "spool"
    p = SpoolProducer(root, "t:0", CONTRACT, producers=1)
    src = SpoolSource(root, "d:0", CONTRACT, producers=1)
    p.publish(*frame(0))
    consume(src, 0)
    assert os.listdir(root / "free") == [frame_file("t:0", 0)]
    run_faulty(KILLED_MID_WRITE, root, faults, -9, DFI_KILL_MID_WRITEV="1")  # took the file from free/, wrote half of frame 1 over it, died
    assert os.listdir(root / "free") == [] and os.listdir(root / "ready") == []
    assert os.listdir(root / "tmp") == [frame_file("t:0", 1) + ".tmp"]
    again = SpoolProducer(root, "t:0", CONTRACT, producers=1)  # its restart: the half frame goes, seq 1 again
    assert again.next_seq == 1 and os.listdir(root / "tmp") == []
    again.publish(*frame(1))
    consume(src, 1)
    again.finish()
    assert src.next_sample() is None
    m, final = manifest(root, 1)
    assert final and m["exactly_once"] and m["frames_consumed"] == 2, m


@pytest.mark.parametrize("consumers", [2])
def test_producers_and_consumers_share_the_ring_in_separate_processes_exactly_once(tmp_path, consumers):
    """Two producer and two consumer processes, 12 frames each producer, the ring on: every frame's values are
    its producer's (each consumer checks every one), exactly once, and the files were reused."""
    root = tmp_path / "spool"
    script = """
import os, sys, torch
sys.path.insert(0, {python!r})
from dflash_launch import contract_from_env
from dflash_launch.spool import SpoolProducer, SpoolSource
kind, i = sys.argv[1], int(sys.argv[2])
def frame(p, seq):
    g = torch.Generator().manual_seed(1000 * p + seq)
    return torch.randn(1, 32, 2400, generator=g), torch.randint(0, 63, (1, 32), generator=g)
if kind == "p":
    p = SpoolProducer({root!r}, f"t:{{i}}", contract_from_env(), producers=2, max_ready=2)
    for seq in range(12):
        p.publish(*frame(i, seq))
    p.finish()
else:
    src = SpoolSource({root!r}, f"d:{{i}}", contract_from_env(), producers=2)
    for s in src:
        h, t = frame(int(s["producer"][2:]), s["seq"])
        assert torch.equal(s["hidden"], h) and torch.equal(s["tokens"], t), s["frame"]
        s["hidden"].add_(1)  # a trainer's in-place op
        s["ack"]()
    print(src.stats()["mappings_reused"])
""".format(python=str(ROOT / "python"), root=str(root))
    procs = [subprocess.Popen([sys.executable, "-c", script, k, str(i)], env=dict(ENV, **RING_ENV),
                              stdout=subprocess.PIPE, text=True) for k in ("p", "c") for i in range(2)]
    deadline = time.monotonic() + 180
    while any(pr.poll() is None for pr in procs) and time.monotonic() < deadline:
        if any(pr.poll() not in (None, 0) for pr in procs):
            break  # one failed: its claim would keep the others waiting for the spool's end
        time.sleep(0.05)
    for pr in procs:
        if pr.poll() is None:
            pr.kill()
    outs = [pr.communicate()[0] for pr in procs]
    assert [pr.returncode for pr in procs] == [0] * 4, outs
    m, final = manifest(root, 2)
    assert final and m["exactly_once"] and m["frames_consumed"] == 24, m
    assert sum(int(o) for o in outs[2:]) > 0, outs  # frames were read through kept mappings
    assert os.listdir(root / "free") == []  # both producers finished: nothing kept


@pytest.mark.parametrize("planted", ["symlink", "fifo", "hardlink", "directory"])
def test_what_stands_in_free_as_a_producers_file_is_never_written_through(tmp_path, planted):
    """free/ is the spool's own (0700), but a file there is written over by a producer: a link to elsewhere, a
    FIFO (an open that would block), a file with a second name, or a directory under a frame's name is dropped
    or left, never written through, and the frame goes to a new file with its values."""
    root = tmp_path / "spool"
    p = SpoolProducer(root, "t:0", CONTRACT, producers=1)
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me" * 4096)
    planted_at = root / "free" / frame_file("t:0", 0)
    if planted == "symlink":
        os.symlink(victim, planted_at)
    elif planted == "fifo":
        os.mkfifo(planted_at)
    elif planted == "hardlink":
        os.link(victim, planted_at)
    else:
        os.mkdir(planted_at)
    p.publish(*frame(0))
    assert victim.read_bytes() == b"keep me" * 4096
    src = SpoolSource(root, "d:0", CONTRACT, producers=1)
    consume(src, 0)
    p.finish()
    assert src.next_sample() is None and victim.read_bytes() == b"keep me" * 4096


def test_without_pagemap_the_ring_goes_on_and_no_mapping_is_kept(tmp_path, faults):
    """Where /proc/self/pagemap cannot be read (no /proc, a hardened kernel) a mapping's copied pages cannot be
    found: it is not kept, and every frame is read from a new mapping, right."""
    root = tmp_path / "spool"
    p = SpoolProducer(root, "t:0", CONTRACT, producers=1)
    for seq in range(3):
        p.publish(*frame(seq))
    out = run_faulty(CONSUME_THREE, root, faults, 0, DFI_NO_PAGEMAP="1").split("\n")
    assert [line.split()[0] for line in out[:3]] == ["1", "2", "3"] and out[3] == "0", out  # handed back, none kept


def test_kept_mappings_hold_no_descriptors():
    """The library keeps the ring's mappings without their files' descriptors (Python's mmap held one each, and
    a low open-files limit had to cap them): 12 frames read through kept mappings under RLIMIT_NOFILE 40, the
    process's open descriptors the same before and after."""
    script = """
import os, resource, shutil, sys, tempfile, torch
sys.path.insert(0, {python!r})
resource.setrlimit(resource.RLIMIT_NOFILE, (40, 40))
from dflash_launch import contract_from_env
from dflash_launch.spool import SpoolProducer, SpoolSource
root = tempfile.mkdtemp(dir="/dev/shm")
p, src = SpoolProducer(root, "t:0", contract_from_env(), producers=1), SpoolSource(root, "d:0", contract_from_env(), producers=1)
p.publish(torch.randn(1, 32, 2400), torch.randint(0, 63, (1, 32))); s = src.next_sample(); s["ack"](); del s; src.release()
before = len(os.listdir("/proc/self/fd"))
for seq in range(12):
    p.publish(torch.randn(1, 32, 2400), torch.randint(0, 63, (1, 32))); s = src.next_sample(); s["ack"](); del s
src.release()
print(before, len(os.listdir("/proc/self/fd")), src.stats()["mappings_reused"])
shutil.rmtree(root)
"""
    r = subprocess.run([sys.executable, "-c", script.format(python=str(ROOT / "python"))], env=dict(ENV, **RING_ENV),
                       capture_output=True, text=True, timeout=120)
    before, after, reused = map(int, r.stdout.split())
    assert before == after and reused > 0, (r.stdout, r.stderr)


PAUSED_WITH_A_VIEW = """
import os, signal, sys, torch
sys.path.insert(0, {python!r})
from dflash_launch import contract_from_env
from dflash_launch.spool import SpoolSource
src = SpoolSource({root!r}, "d:0", contract_from_env(), producers=1)
s = src.next_sample()
kept, want = s["hidden"], s["hidden"].clone()
s["ack"]()
del s
src.release()
os.kill(os.getpid(), signal.SIGSTOP)  # paused with a view of its acknowledged frame
sys.exit(0 if torch.equal(kept, want) else 3)
"""


def test_a_consumer_paused_with_a_view_keeps_its_file_out_of_the_ring(tmp_path):
    """SIGSTOP at the worst moment: a consumer paused while a view of its acknowledged frame lives. Its file only
    goes back when that process sees the view die, so while it is stopped the others' frames go to new files and
    its view is unchanged when it runs again."""
    root = tmp_path / "spool"
    p = SpoolProducer(root, "t:0", CONTRACT, producers=1)
    p.publish(*frame(0))
    child = subprocess.Popen([sys.executable, "-c", PAUSED_WITH_A_VIEW.format(python=str(ROOT / "python"),
                                                                                root=str(root))],
                             env=dict(ENV, **RING_ENV))
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # stopped: /proc says T
            with open(f"/proc/{child.pid}/stat") as f:
                if f.read().split(") ", 1)[1].startswith("T"):
                    break
            assert child.poll() is None
            time.sleep(0.05)
        first = ino(root / "done" / frame_file("t:0", 0))
        src = SpoolSource(root, "d:1", CONTRACT, producers=1)
        for seq in range(1, 4):
            p.publish(*frame(seq))
            assert ino(root / "ready" / frame_file("t:0", seq)) != first
            consume(src, seq)
        assert frame_file("t:0", 0) not in os.listdir(root / "free")
    finally:
        os.kill(child.pid, signal.SIGCONT)
    assert child.wait(timeout=120) == 0  # its view read frame 0, untouched
