"""The producer's write path and the byte budget (issue #49, items 2-3): a frame written once from the tensors'
memory reads back the same in safetensors and in the mapped consumer; a byte budget stops a producer and
resumes it; a frame the budget can never hold is an error at once; a full filesystem is SpoolFull with nothing
published, nothing half-written and nothing lost (a real 256 KiB tmpfs, mounted in a user namespace)."""
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import pytest
import torch

from conftest import ROOT
from test_spool import CONTRACT, ENV, SMALL_ENV

sys.path.insert(0, str(ROOT / "python"))
from dflash_launch.spool import SpoolError, SpoolProducer, SpoolSource, frame_file, manifest  # noqa: E402
from dflash_launch.spool import default_max_bytes  # noqa: E402

FRAME = 12856  # bytes of a SMALL frame with a one-digit seq (header + tokens + hidden)


def test_a_frame_written_once_reads_back_in_safetensors_and_the_mapping(tmp_path):
    """The library's header and writev from the tensors' memory (bf16 included) make a file the safetensors
    package reads back bit for bit, private (0600), and the mapped consumer reads the same."""
    from safetensors import safe_open
    from safetensors.torch import load_file
    contract = dict(CONTRACT, dtype="bf16")
    p = SpoolProducer(tmp_path / "s", "t:0", contract)
    hidden, tokens = torch.randn(1, 32, 96).to(torch.bfloat16), torch.randint(0, 63, (1, 32))
    p.publish(hidden, tokens, metadata={"n": 7})
    path = tmp_path / "s" / "ready" / frame_file("t:0", 0)
    back = load_file(str(path))
    assert torch.equal(back["hidden"], hidden) and torch.equal(back["tokens"], tokens)
    with safe_open(str(path), "pt") as f:
        assert f.metadata()["n"] == "7" and f.metadata()["producer"] == "t:0" and f.metadata()["seq"] == "0"
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    s = SpoolSource(tmp_path / "s", "d:0", contract, producers=1).next_sample()
    assert torch.equal(s["hidden"], hidden) and torch.equal(s["tokens"], tokens)


def test_a_byte_budget_stops_a_producer_and_resumes_it(tmp_path):
    root = tmp_path / "spool"
    p = SpoolProducer(root, "t:0", CONTRACT, max_ready=1000, max_bytes=int(2.5 * FRAME) + 8192)
    held, done = [], threading.Event()

    def produce():
        for seq in range(5):
            g = torch.Generator().manual_seed(seq)
            p.publish(torch.randn(1, 32, 96, generator=g), torch.randint(0, 63, (1, 32), generator=g))
        p.finish()
        done.set()
    t = threading.Thread(target=produce)
    t.start()
    deadline = time.monotonic() + 60
    while len(os.listdir(root / "ready")) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.5)
    assert len(os.listdir(root / "ready")) == 2 and not done.is_set()  # stopped by bytes, not by max_ready
    src = SpoolSource(root, "d:0", CONTRACT, producers=1)
    seqs = []
    for s in src:
        held.append(len(os.listdir(root / "ready")))
        seqs.append(s["seq"])
        s["ack"]()
    t.join(60)
    assert done.is_set() and seqs == [0, 1, 2, 3, 4] and max(held) <= 2, (seqs, held)
    m, final = manifest(root, 1)
    assert final and m["exactly_once"], m


def test_a_frame_the_budget_can_never_hold_is_an_error_at_once(tmp_path):
    p = SpoolProducer(tmp_path / "spool", "t:0", CONTRACT, max_bytes=FRAME // 2)
    with pytest.raises(SpoolError, match=f"a frame of {FRAME} bytes can never fit the spool's byte budget"):
        p.publish(torch.randn(1, 32, 96), torch.randint(0, 63, (1, 32)))
    assert os.listdir(tmp_path / "spool" / "tmp") == [] and os.listdir(tmp_path / "spool" / "ready") == []


def test_the_default_budget_is_a_share_of_the_filesystem_or_the_launchers(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    assert abs(default_max_bytes(tmp_path, env={}) - free // 2) < free // 100
    assert default_max_bytes(tmp_path, env={"DFLASH_SPOOL_MAX_BYTES": "123456"}) == 123456
    for bad in ("12k", "0", "-5"):
        with pytest.raises(SpoolError, match="DFLASH_SPOOL_MAX_BYTES"):
            default_max_bytes(tmp_path, env={"DFLASH_SPOOL_MAX_BYTES": bad})


FULL_SCRIPT = """
import os, sys, torch
sys.path.insert(0, {python!r})
from dflash_launch import contract_from_env
from dflash_launch.spool import SpoolProducer, SpoolSource
from dflash_launch.spool import SpoolFull
c, root = contract_from_env(), {root!r}
p = SpoolProducer(root, "t:0", c, max_ready=1000, max_bytes=1 << 40)  # no budget: the filesystem fills
frames = [(torch.randn(1, 32, 96), torch.randint(0, 63, (1, 32))) for _ in range(40)]
published = 0
try:
    for h, t in frames:
        p.publish(h, t)
        published += 1
except SpoolFull as e:
    print("FULL", published, p.next_seq, len(os.listdir(os.path.join(root, "tmp"))), str(e).replace(chr(10), " "))
src = SpoolSource(root, "d:0", c, producers=1)
for _ in range(3):  # the drafters make room
    s = src.next_sample(); s["ack"](); del s
src.release()
h, t = frames[published]
print("AGAIN", p.publish(h, t))  # the same frame, the same sequence number: nothing lost
"""


def test_a_full_filesystem_is_a_clear_error_that_loses_nothing(tmp_path):
    mnt = tmp_path / "shm"
    mnt.mkdir()
    root = mnt / "spool"
    script = FULL_SCRIPT.format(python=str(ROOT / "python"), root=str(root))
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no user namespaces here: {probe.stderr.decode().strip()}")
    r = subprocess.run(["unshare", "-rm", "sh", "-c", f'mount -t tmpfs -o size=256k,mode=0700 tmpfs "$0" && '
                        f'exec "$1" -c "$2"', str(mnt), sys.executable, script],
                       env=dict(ENV, **SMALL_ENV), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    full = next(line for line in r.stdout.splitlines() if line.startswith("FULL")).split(maxsplit=4)
    published, next_seq, in_tmp, message = int(full[1]), int(full[2]), int(full[3]), full[4]
    assert 5 < published < 40 and next_seq == published and in_tmp == 0, r.stdout
    assert re.search(r"cannot hold a frame of 128\d\d bytes", message) and "nothing was published" in message
    again = next(line for line in r.stdout.splitlines() if line.startswith("AGAIN"))
    assert again == f"AGAIN {published}", r.stdout
