"""A frame that cannot be read as the contract says is quarantined (issue #46, item 1): truncated data, a header
that is a JSON list, a __metadata__ that is not an object, garbage bytes... Each is moved to rejected/ with its
reason, raises FrameContractError (exit 65) naming its producer and frame, and is never delivered again; a
WorldSource world stops at once with 65 on every rank, the peers naming the producer and the frame. Before, only
ValueError/KeyError from the header were caught: the rest escaped as a restartable failure, the frame stayed
claimed and every restart met it again."""
import json
import os
import random
import struct
import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from test_spool import CONTRACT, ENV, SMALL_ENV
from test_spool_world import WORLD, run_world

sys.path.insert(0, str(ROOT / "python"))
from dflash_launch.spool import (FrameContractError, SpoolProducer, SpoolSource, frame_bytes, frame_file,  # noqa: E402
                                 frame_metadata, manifest)


def good_bytes(seq=0, producer="evil:0"):
    g = torch.Generator().manual_seed(seq)
    meta = dict(frame_metadata(CONTRACT), producer=producer, seq=str(seq))
    return frame_bytes(torch.randn(1, 32, 96, generator=g), torch.randint(0, 63, (1, 32), generator=g), meta)


def split(data):
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]), data[8 + n:]


def join(header, body):
    text = json.dumps(header).encode() if not isinstance(header, bytes) else header
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + body


def with_header(edit):
    def make():
        h, body = split(good_bytes())
        return join(edit(h), body)
    return make


BAD = {
    "truncated data": lambda: good_bytes()[:-100],
    "a header that is a JSON list": lambda: join(b"[1, 2, 3]", split(good_bytes())[1]),
    "a __metadata__ that is a list": with_header(lambda h: dict(h, __metadata__=["format", "dflash-frame/1"])),
    "a __metadata__ that is a string": with_header(lambda h: dict(h, __metadata__="dflash-frame/1")),
    "a metadata value that is a number": with_header(lambda h: dict(h, __metadata__=dict(h["__metadata__"], seq=0))),
    "a tensor entry that is a list": with_header(lambda h: dict(h, hidden=[1, 32, 96])),
    "a shape of strings": with_header(lambda h: dict(h, hidden=dict(h["hidden"], shape=["1", "32", "96"]))),
    "garbage bytes": lambda: random.Random(0).randbytes(4096),
    "a header length past the end": lambda: struct.pack("<Q", 1 << 40) + b"{}",
    "an empty file": lambda: b"",
    "a header that is not JSON": lambda: join(b"{not json", b""),
}


def stage(root, data, seq=0, producer="evil:0"):
    """What a broken producer publishes: `data` renamed into ready/ like any frame."""
    SpoolProducer(root, producer, CONTRACT)  # the spool's directories
    name = frame_file(producer, seq)
    tmp = root / "tmp" / (name + ".tmp")
    tmp.write_bytes(data)
    os.rename(tmp, root / "ready" / name)
    return SpoolProducer(root, producer, CONTRACT), name  # resumes past it


@pytest.mark.parametrize("kind", sorted(BAD))
def test_a_frame_that_cannot_be_read_is_quarantined_and_never_delivered_again(tmp_path, kind):
    root = tmp_path / "spool"
    p, bad = stage(root, BAD[kind]())
    good = SpoolProducer(root, "good:0", CONTRACT)
    good.publish(torch.randn(1, 32, 96), torch.randint(0, 63, (1, 32)))
    good.finish()
    p.finish()
    src = SpoolSource(root, "d:0", CONTRACT, producers=2)
    with pytest.raises(FrameContractError) as e:
        src.next_sample()  # evil:0's frame sorts first (seq 0, then producer name)
    assert e.value.exit_code == 65 and e.value.frame == bad and e.value.producer == "evil:0", str(e.value)
    assert f"frame {bad} from producer evil:0 does not match [model]" in str(e.value)
    # Moved aside with its reason; not claimed, so a restart of the consumer never takes it back.
    assert (root / "rejected" / bad).exists() and not (root / "ready" / bad).exists()
    reason = (root / "rejected" / f"{bad}.reason").read_text()
    assert reason.strip() == str(e.value)
    assert os.listdir(root / "claimed" / "d:0") == []
    again = SpoolSource(root, "d:0", CONTRACT, producers=2)  # the restarted consumer
    seen = []
    for s in again:
        seen.append(s["frame"])
        s["ack"]()
    assert seen == [frame_file("good:0", 0)]
    m, final = manifest(root, 2)
    assert final and m["rejected"] == [bad] and not m["exactly_once"], m
    # The producer resumes past it: its next frame never reuses the quarantined name.
    assert SpoolProducer(root, "evil:0", CONTRACT).next_seq == 1


def test_an_io_error_is_not_a_bad_frame(tmp_path, monkeypatch):
    """The spool's files failing (an OSError) is not the frame's fault: it stays claimed for a restart, nothing
    is quarantined, and the error is not a contract error."""
    root = tmp_path / "spool"
    p = SpoolProducer(root, "t:0", CONTRACT)
    p.publish(torch.randn(1, 32, 96), torch.randint(0, 63, (1, 32)))
    import dflash_launch.spool.source as source_mod

    def broken(path, cache=None):
        raise OSError(5, "Input/output error (injected)", path)
    monkeypatch.setattr(source_mod, "MappedFrame", broken)
    src = SpoolSource(root, "d:0", CONTRACT, producers=1)
    with pytest.raises(OSError) as e:
        src.next_sample()
    assert not isinstance(e.value, FrameContractError)
    assert os.listdir(root / "rejected") == [] and os.listdir(root / "claimed" / "d:0") == [frame_file("t:0", 0)]


def test_broken_shared_weights_are_a_contract_error(tmp_path):
    root = tmp_path / "spool"
    SpoolProducer(root, "t:0", CONTRACT)
    (root / "weights.safetensors").write_bytes(join(b"[]", b""))
    with pytest.raises(FrameContractError) as e:
        SpoolSource(root, "d:0", CONTRACT, producers=1).shared_weights()
    assert e.value.exit_code == 65 and "the header is a list" in str(e.value)


def stage_in_world(kind, seq):
    def fill(root, frames):
        p = SpoolProducer(root, "target:0", CONTRACT, max_ready=1000)
        for s in range(frames):
            if s == seq:
                name = frame_file("target:0", s)
                (root / "tmp" / name).write_bytes(BAD[kind]())
                os.rename(root / "tmp" / name, root / "ready" / name)
                p = SpoolProducer(root, "target:0", CONTRACT, max_ready=1000)  # resumes past it
                continue
            g = torch.Generator().manual_seed(s)
            p.publish(torch.randn(1, 32, 96, generator=g), torch.randint(0, 63, (1, 32), generator=g))
        p.finish()
    return fill


@pytest.mark.parametrize("kind", ["truncated data", "a header that is a JSON list"])
def test_a_world_stops_at_once_with_65_naming_the_producer_and_the_frame(tmp_path, kind):
    """3 gloo ranks, frame 4 unreadable: the rank that claims it quarantines it and exits 65; its peers exit 65
    in the same round naming the frame and its producer (not WorldSpoolFailed's 1, which a policy restarts)."""
    codes, errs, outs, root = run_world(tmp_path, "world", frames=10, fill=stage_in_world(kind, 4))
    assert codes == [65] * WORLD, errs
    bad = frame_file("target:0", 4)
    culprit = [r for r in range(WORLD) if f"frame {bad} from producer target:0 does not match [model]" in errs[r]]
    assert len(culprit) == 1, errs
    for r in range(WORLD):
        if r != culprit[0]:
            assert (f"drafter:{r} (rank {r}) stops: the frame of rank {culprit[0]} violated [model] and was "
                    f"quarantined in rejected/ (rank {culprit[0]}: frame {bad} from producer target:0 (not a frame "
                    f"the contract can read))") in errs[r], errs[r]
    assert (root / "rejected" / bad).exists() and (root / "rejected" / f"{bad}.reason").exists()
    m, final = manifest(root, 1)
    assert not final and m["rejected"] == [bad] and m["claimed"] == 2, m
    assert all(o is None for o in outs)


# --- mapped frames (issue #49, item 1) ------------------------------------------

def one_frame(root, seq=0):
    p = SpoolProducer(root, "t:0", CONTRACT)
    g = torch.Generator().manual_seed(seq)
    hidden, tokens = torch.randn(1, 32, 96, generator=g), torch.randint(0, 63, (1, 32), generator=g)
    p.publish(hidden, tokens)
    p.finish()
    return hidden, tokens


def mapped_file(address):
    """The file /proc/self/maps says is mapped at `address` (None for anonymous memory)."""
    for line in open("/proc/self/maps"):
        parts = line.split(maxsplit=5)
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        if lo <= address < hi:
            return parts[5].strip() if len(parts) > 5 else None
    return None


def test_a_frame_is_delivered_as_views_of_its_mapping_and_writes_never_reach_the_spool(tmp_path):
    root = tmp_path / "spool"
    hidden, tokens = one_frame(root)
    src = SpoolSource(root, "d:0", CONTRACT, producers=1)
    s = src.next_sample()
    claimed = root / "claimed" / "d:0" / s["frame"]
    before = claimed.read_bytes()
    assert torch.equal(s["hidden"], hidden) and torch.equal(s["tokens"], tokens)
    # A view of the file's pages: both tensors' memory lies in a mapping of the claimed file.
    for t in (s["hidden"], s["tokens"]):
        assert mapped_file(t.data_ptr()) == str(claimed), (t.data_ptr(), open("/proc/self/maps").read())
    s["hidden"].mul_(0).add_(7)  # an in-place op of a trainer: copy-on-write, this process only
    s["tokens"][0, 0] = 5
    assert claimed.read_bytes() == before
    assert float(s["hidden"].mean()) == 7.0
    s["ack"]()


def test_a_view_kept_past_ack_stays_readable_and_the_bytes_go_after_it(tmp_path):
    """A trainer that keeps a frame's tensor after acknowledging it (a metrics buffer, a deferred loss) reads its
    values, never a SIGBUS of a truncated page; the frame's bytes go at the first claim after the view died.
    In a child process, so a SIGBUS is a clean failure."""
    root = tmp_path / "spool"
    one_frame(root, 0)
    p = SpoolProducer(root, "t:0", CONTRACT)
    p.publish(torch.ones(1, 32, 96), torch.zeros(1, 32, dtype=torch.long))
    p.finish()
    script = f"""
import os, sys, torch
sys.path.insert(0, {str(ROOT / 'python')!r})
from dflash_launch import contract_from_env
from dflash_launch.spool import SpoolSource
root = {str(root)!r}
src = SpoolSource(root, "d:0", contract_from_env(), producers=1)
s = src.next_sample()
kept = s["hidden"][0, 1:3]          # a view of a view: still the mapping
want = float(kept.double().sum())
s["ack"]()
done = os.path.join(root, "done", s["frame"])
size_after_ack = os.path.getsize(done)
del s
again = float(kept.double().sum())  # after the ack: the pages are still there
n = src.next_sample()               # a claim sweeps: kept still maps frame 0
size_with_view = os.path.getsize(done)
del kept
n["ack"]()                          # the next sweep: frame 0 has no view left
src.release()                       # (its truncate runs on the source's thread: wait for it)
print(size_after_ack, size_with_view, os.path.getsize(done), want == again)
"""
    r = subprocess.run([sys.executable, "-c", script], env=dict(ENV, **SMALL_ENV), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr)
    after_ack, with_view, after_view, same = r.stdout.split()
    assert int(after_ack) > 0 and int(with_view) > 0 and int(after_view) == 0 and same == "True", r.stdout


def test_a_consumer_killed_while_it_holds_a_view_loses_nothing(tmp_path):
    """SIGKILL while a mapped frame is being trained on: the frame stays claimed, intact, and the restarted
    consumer takes it back with the same values (exactly once)."""
    root = tmp_path / "spool"
    hidden, tokens = one_frame(root)
    script = f"""
import os, sys, signal
sys.path.insert(0, {str(ROOT / 'python')!r})
from dflash_launch import contract_from_env
from dflash_launch.spool import SpoolSource
s = SpoolSource({str(root)!r}, "d:0", contract_from_env(), producers=1).next_sample()
s["hidden"].add_(1)
os.kill(os.getpid(), signal.SIGKILL)
"""
    r = subprocess.run([sys.executable, "-c", script], env=dict(ENV, **SMALL_ENV), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == -9, r.stderr
    src = SpoolSource(root, "d:0", CONTRACT, producers=1)
    got = [(s["seq"], s["taken_back"], torch.equal(s["hidden"], hidden), s["ack"]()) for s in src]
    assert got == [(0, True, True, None)]
    m, final = manifest(root, 1)
    assert final and m["exactly_once"], m


def test_a_mapped_frame_violating_the_contract_is_caught_before_any_compute(tmp_path):
    root = tmp_path / "spool"
    p = SpoolProducer(root, "t:0", CONTRACT)
    tokens = torch.randint(0, 63, (1, 32))
    tokens[0, 7] = 64  # vocab is 64
    p.publish(torch.randn(1, 32, 96), tokens, check=False)
    p.finish()
    with pytest.raises(FrameContractError, match="token id out of range") as e:
        SpoolSource(root, "d:0", CONTRACT, producers=1).next_sample()
    assert "id 64 at position 7" in str(e.value)
    assert (root / "rejected" / frame_file("t:0", 0)).exists()


def test_pin_on_a_machine_without_cuda_delivers_pageable_views(tmp_path):
    """The pinned path (cudaHostRegister of the mapping) where CUDA is absent: the same frames, unpinned."""
    root = tmp_path / "spool"
    hidden, _ = one_frame(root)
    src = SpoolSource(root, "d:0", CONTRACT, producers=1, pin=True)
    s = src.next_sample()
    assert torch.equal(s["hidden"], hidden)
    assert src.pinned == (1 if torch.cuda.is_available() else 0)
    assert s["hidden"].is_pinned() == torch.cuda.is_available()
    s["ack"]()
    del s
    assert src.release() == 0


# --- under the launcher: a world of 2 ranks, a producer that publishes garbage ------

GARBAGE_TARGET = r"""
import os, torch
from dflash_launch import contract_from_env
from dflash_launch.spool import SpoolProducer, frame_file
p = SpoolProducer.from_env(contract_from_env())
for seq in range(3):
    p.publish(torch.randn(1, 32, 96), torch.randint(0, 63, (1, 32)))
name = frame_file(p.name, p.next_seq)  # then a frame whose header is a JSON list, renamed in like any other
tmp = os.path.join(p.paths.tmp, name + ".tmp")
open(tmp, "wb").write((8).to_bytes(8, "little") + b"[1, 2]  " + bytes(64))
os.rename(tmp, os.path.join(p.paths.ready, name))
p = SpoolProducer.from_env(contract_from_env())  # resumes past it
for seq in range(3):
    p.publish(torch.randn(1, 32, 96), torch.randint(0, 63, (1, 32)))
p.finish()
"""

WORLD_DRAFTER = r"""
import torch
from dflash_launch import contract_from_env, init_process_group
from dflash_launch.spool.world import WorldSource
init_process_group("gloo")
for s in WorldSource.from_env(contract_from_env()):
    s["hidden"].float().sum()
"""


def test_a_world_role_meets_an_unreadable_frame_exits_65_and_is_not_restarted(launch, tmp_path):
    """#46.1 under dflash-launch: before, the drafter world restarted on the same frame until its budget was
    gone. Now the rank that claims it quarantines it and exits 65, its peer stops with 65 in the same round
    naming the producer and the frame, and the world is not restarted."""
    from supervise import write_config
    (tmp_path / "target.py").write_text(GARBAGE_TARGET)
    (tmp_path / "drafter.py").write_text(WORLD_DRAFTER)
    from test_spool import SMALL
    cfg = write_config(tmp_path, f'spool_dir = "{tmp_path}/spool"\n' + SMALL + f"""
[[role]]
name = "target"
cpu = 1
spool = "produce"
command = ["python", "{tmp_path}/target.py"]

[[role]]
name = "drafter"
cpu = 2
spool = "consume"
world = "role"
command = ["python", "{tmp_path}/drafter.py"]
restart = {{ policy = "on-failure", scope = "role", max = 3, backoff = "100ms..100ms" }}
""")
    r = launch(cfg, env=ENV)
    assert r.wait(timeout=300) == 65, r.out[-3000:] + r.err
    s = r.summary()
    procs = {p["name"]: p for p in s["processes"]}
    assert procs["drafter:0"]["restarts"] == 0 and procs["drafter:1"]["restarts"] == 0, procs
    bad = "target:0-0000000003.safetensors"
    errs = {n: (tmp_path / procs[n]["log"]["stderr"]).read_text() for n in ("drafter:0", "drafter:1")}
    culprit = [n for n, e in errs.items() if f"frame {bad} from producer target:0 does not match [model]" in e]
    assert len(culprit) == 1, errs
    peer = ({"drafter:0", "drafter:1"} - set(culprit)).pop()
    assert f"frame {bad} from producer target:0 (not a frame the contract can read)" in errs[peer], errs[peer]
    assert "the header is a list, not a JSON object" in errs[culprit[0]]
    assert all(e.count("Traceback") == 1 for e in errs.values())  # one attempt each


def test_the_gpu_checks_pinned_spool_runs_on_cpu(tmp_path):
    """gpu-check's (f) on this CPU machine: the same code path, views pageable, ok; on CUDA it must pin."""
    from dflash_launch.tools import spool_pin_check
    c = spool_pin_check.gpu_check("cpu", tmp_path)
    assert c["ok"] and c["equal"] and not c["pinned"] and c["device"] == "cpu", c
    assert "(f) pinned  ok" in spool_pin_check.summary_line(c)
    assert not (tmp_path / "pinned-spool").exists()
