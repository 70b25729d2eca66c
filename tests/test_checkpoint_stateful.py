"""One protocol between a Checkpoint and what it carries (issue #56 item 3, dflash_launch.stateful): a state of the
user's own (here a data-loader cursor: a position and a torch.Generator that draws the batches) given as
`states=[cursor]` is saved with each checkpoint and loaded back, so a process killed -9 mid-run and restarted ends
with the weights, optimizer state and cursor of the run never killed, bit for bit. Without the cursor in `states`
the restarted run draws other batches (the revert check: the same scripts with CURSOR_CARRIED=0)."""
import os
import signal
import subprocess
import sys

import pytest
import torch

from test_spool import ENV

TRAIN = """
import os, signal, sys, torch
from dflash_launch import Checkpoint

class Cursor:
    '''Where a data loader is: the batches it handed out and the generator that draws the next.'''
    def __init__(self):
        self.position, self.gen = 0, torch.Generator().manual_seed(7)

    def next_batch(self):
        self.position += 1
        return torch.randn(8, 4, generator=self.gen), torch.randint(0, 3, (8,), generator=self.gen)

    def state_dict(self):
        return {"position": self.position, "gen": self.gen.get_state()}

    def load_state_dict(self, state):
        self.position = state["position"]
        self.gen.set_state(state["gen"])

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
cursor = Cursor()
carried = [cursor] if os.environ.get("CURSOR_CARRIED", "1") == "1" else []
ck = Checkpoint(model, opt, every_steps=3, dir=sys.argv[1], states=carried, async_save=False, env={})
start = ck.restore()
kill_at = int(sys.argv[2])
for step in range(start, 10):
    x, y = cursor.next_batch()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    if step == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)  # mid-step: after its backward, before the optimizer
    opt.step()
    opt.zero_grad()
    ck.step(step)
ck.finish()
torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "cursor": cursor.state_dict()}, sys.argv[3])
"""


def train(ck_dir, kill_at, out, carried=True):
    env = dict(ENV, OMP_NUM_THREADS="1", CURSOR_CARRIED="1" if carried else "0")
    return subprocess.run([sys.executable, "-c", TRAIN, str(ck_dir), str(kill_at), str(out)], env=env,
                          capture_output=True, text=True, timeout=300)


def flat(state, prefix=""):
    """[(key, tensor or value)] of a nested state, in a fixed order."""
    if isinstance(state, dict):
        return [kv for k in sorted(state, key=str) for kv in flat(state[k], f"{prefix}.{k}")]
    if isinstance(state, (list, tuple)):
        return [kv for i, v in enumerate(state) for kv in flat(v, f"{prefix}.{i}")]
    return [(prefix, state)]


def differing(a, b):
    """The keys whose values differ (tensors by torch.equal: bitwise)."""
    fa, fb = flat(a), flat(b)
    assert [k for k, _ in fa] == [k for k, _ in fb]
    return [k for (k, x), (_, y) in zip(fa, fb)
            if not (torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y)]


def killed_then_resumed(tmp_path, carried):
    killed = train(tmp_path / "ck", 7, tmp_path / "unused.pt", carried)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert sorted(n for n in os.listdir(tmp_path / "ck") if n.startswith("step-")) == ["step-0000000003",
                                                                                        "step-0000000006"]
    resumed = train(tmp_path / "ck", -1, tmp_path / "resumed.pt", carried)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from step 6" in resumed.stderr, resumed.stderr[-2000:]
    return torch.load(tmp_path / "resumed.pt", weights_only=True)


@pytest.mark.parametrize("carried", [True, False], ids=["cursor-carried", "revert-check-cursor-not-carried"])
def test_a_cursor_of_the_users_own_resumes_bitwise(tmp_path, carried):
    whole = train(tmp_path / "whole", -1, tmp_path / "whole.pt", carried)
    assert whole.returncode == 0, whole.stderr[-2000:]
    expected = torch.load(tmp_path / "whole.pt", weights_only=True)
    got = killed_then_resumed(tmp_path, carried)
    diff = differing(expected, got)
    if carried:
        assert diff == [], diff  # every parameter, AdamW tensor and the cursor's generator, bit for bit
        assert got["cursor"]["position"] == 10
    else:  # the resumed run starts its batches over: other data, other weights (what the protocol prevents)
        assert ".cursor.position" in diff and any(k.startswith(".model.") for k in diff), diff


def test_what_is_not_a_stateful_is_refused_by_name(tmp_path):
    from dflash_launch import Checkpoint, CommitHooks

    class NoLoad:
        def state_dict(self):
            return {}

    class HalfCommitting:  # a hook of Committing's, not the others: which it meant is not guessed
        def state_dict(self):
            return {}

        def load_state_dict(self, state):
            pass

        def pending_level(self):
            return 3.0

    class Hooks(CommitHooks):
        def state_dict(self):
            return {}

        def load_state_dict(self, state):
            pass

    m = torch.nn.Linear(2, 2)
    with pytest.raises(TypeError, match="NoLoad is not a Stateful .it lacks load_state_dict"):
        Checkpoint(m, None, dir=str(tmp_path), states=[NoLoad()], env={})
    with pytest.raises(TypeError, match="HalfCommitting has pending_level .* but not attached, start_over"):
        Checkpoint(m, None, dir=str(tmp_path), states=[HalfCommitting()], env={})
    with pytest.raises(ValueError, match="two states named 'source'"):
        Checkpoint(m, None, dir=str(tmp_path), source=Hooks(), states={"source": Hooks()}, env={})
    ck = Checkpoint(m, None, dir=str(tmp_path), states={"mine": Hooks()}, env={})
    assert list(ck.states) == ["mine"]
