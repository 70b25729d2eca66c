"""What the new user tripped on (issue #47, items 2-4): one console line for what every rank of a role says, the
package quiet on its documented pattern, hf_target's progress bars off unless asked, seed --verify on a script
that reports only through TrainingMetrics, and a gate key that follows model code in namespace packages (and names
what it cannot follow, with the key_files line that would)."""
import json
import os
import re
import subprocess
import sys
import textwrap

from conftest import ROOT, run
from supervise import wait_until, write_config

PY = sys.executable
ENV = dict(os.environ, PATH=f"{os.path.dirname(PY)}:{os.environ['PATH']}", PYTHONPATH=str(ROOT / "python"))
WARNING = "UserWarning: graph break in flex_attention"


def saying_roles(barrier):
    """drafter: 3 processes that, released together, say the same warning (stderr), a line that differs only in
    a number, and one line of rank 1's own; solo: one process that says the same warning."""
    drafter = (f'touch "{barrier}/in.$ROLE_RANK"; while [ ! -e "{barrier}/go" ]; do sleep 0.01; done; '
               f'echo "{WARNING}" >&2; echo "rank $ROLE_RANK at step 7"; '
               f'if [ "$ROLE_RANK" = 1 ]; then echo "only rank one"; fi')
    solo = f'while [ ! -e "{barrier}/go" ]; do sleep 0.01; done; echo "{WARNING}" >&2'
    return f"""
[[role]]
name = "drafter"
cpu = 3
command = {json.dumps(["sh", "-c", drafter])}

[[role]]
name = "solo"
cpu = 1
command = {json.dumps(["sh", "-c", solo])}
"""


def run_saying(launch, tmp_path, run_id, *args, dedup_key=None):
    barrier = tmp_path / f"barrier-{run_id}"
    barrier.mkdir()
    body = saying_roles(barrier)
    cfg = write_config(tmp_path, body)
    if dedup_key is not None:
        cfg.write_text(cfg.read_text().replace("[run]\n", f"[run]\nconsole_dedup = {dedup_key}\n", 1))
    r = launch(cfg, run_id=run_id, args=args)
    # Released together once all three are there: what they say is said within milliseconds.
    assert wait_until(lambda: len(list(barrier.glob("in.*"))) == 3, 120), r.err
    (barrier / "go").touch()
    assert r.wait(timeout=120) == 0, r.out + r.err
    return r, r.out.splitlines()


def test_a_role_says_each_line_once(launch, tmp_path):
    r, lines = run_saying(launch, tmp_path, "once")
    assert lines.count(f"[drafter:0-2] {WARNING}") == 1, r.out
    assert not any(l.startswith("[drafter:") and WARNING in l and not l.startswith("[drafter:0-2]") for l in lines), r.out
    assert lines.count(f"[solo:0] {WARNING}") == 1, r.out  # another role: its own line
    # Matched with the number masked, every rank's number printed: one rank's number is not everyone's (#59).
    said = [l for l in lines if " at step 7" in l]
    assert said == ["[drafter:0-2] rank 0|1|2 at step 7"], r.out
    assert lines.count("[drafter:1] only rank one") == 1, r.out
    # Every byte in each process's own files.
    for rank in range(3):
        attempt = r.run_dir / "attempt_0"
        assert (attempt / f"drafter-{rank}.stderr.log").read_text() == WARNING + "\n"
        assert (attempt / f"drafter-{rank}.stdout.log").read_text().startswith(f"rank {rank} at step 7\n")


def losses_said(lines):
    """{(rank, step): loss} from console lines "[drafter:0-2] step 10 loss 4.01|4.11|4.21" or "[drafter:1] step ..."."""
    seen = {}
    for line in lines:
        m = re.fullmatch(r"\[drafter:([0-9,-]+)\] step (\d+) loss ([0-9.|]+)", line)
        if not m:
            continue
        ranks = []
        for part in m.group(1).split(","):
            lo, _, hi = part.partition("-")
            ranks += range(int(lo), int(hi or lo) + 1)
        values = m.group(3).split("|")
        values = values * len(ranks) if len(values) == 1 else values  # said alike: once
        assert len(values) == len(ranks), line
        for rank, value in zip(ranks, values):
            assert (rank, int(m.group(2))) not in seen, line
            seen[rank, int(m.group(2))] = value
    return seen


def test_every_ranks_loss_reaches_the_console(launch, tmp_path):
    """Three ranks print their own losses at the same steps (released together, so the console merges them):
    every rank's loss of every step is on the console, as each rank said it (issue #59 item 4)."""
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    drafter = (f'touch "{barrier}/in.$ROLE_RANK"; while [ ! -e "{barrier}/go" ]; do sleep 0.01; done; '
               'for s in 10 20 30; do echo "step $s loss 4.$ROLE_RANK$s"; done; '
               'echo "step 40 loss 3.5"')  # one loss alike on every rank
    cfg = write_config(tmp_path, f'[[role]]\nname = "drafter"\ncpu = 3\ncommand = {json.dumps(["sh", "-c", drafter])}\n')
    r = launch(cfg, run_id="losses")
    assert wait_until(lambda: len(list(barrier.glob("in.*"))) == 3, 120), r.err
    (barrier / "go").touch()
    assert r.wait(timeout=120) == 0, r.out + r.err
    lines = r.out.splitlines()
    expected = {(rank, step): f"4.{rank}{step}" for rank in range(3) for step in (10, 20, 30)}
    expected.update({(rank, 40): "3.5" for rank in range(3)})
    assert losses_said(lines) == expected, r.out
    assert "[drafter:0-2] step 10 loss 4.010|4.110|4.210" in lines, r.out  # merged, in rank order
    assert not any("numbers differ" in l for l in lines), r.out


def test_no_dedup_flag_and_config_key_print_every_line(launch, tmp_path):
    for run_id, args, key in (("flag", ("--no-dedup",), None), ("key", (), "false")):
        r, lines = run_saying(launch, tmp_path, run_id, *args, dedup_key=key)
        for rank in range(3):
            assert lines.count(f"[drafter:{rank}] {WARNING}") == 1, (run_id, r.out)
            assert lines.count(f"[drafter:{rank}] rank {rank} at step 7") == 1, (run_id, r.out)
        assert not any(l.startswith("[drafter:0-2]") for l in lines), (run_id, r.out)


def test_console_dedup_must_be_a_bool(bin_dir, tmp_path):
    cfg = write_config(tmp_path, '[[role]]\nname = "p"\ncpu = 1\ncommand = ["true"]\n')
    cfg.write_text(cfg.read_text().replace("[run]\n", '[run]\nconsole_dedup = "yes"\n', 1))
    r = run([bin_dir / "dflash-launch", "check", cfg])
    assert r.returncode == 2 and f"{cfg}:2:" in r.stderr and "console_dedup" in r.stderr, r.stderr


def test_the_documented_ack_pattern_warns_nothing(tmp_path):
    """sample["ack"](loss) hands TrainingMetrics the loss that requires grad; float() of it warns (torch >= 2.6)."""
    code = textwrap.dedent("""
        import torch
        from dflash_launch.train_metrics import TrainingMetrics
        m = TrainingMetrics(path=%r)
        w = torch.ones(3, requires_grad=True)
        for _ in range(3):
            loss = (w * 2).sum()
            loss.backward()
            m.step(loss)
        m.write()
    """ % str(tmp_path / "m.json"))
    r = run([PY, "-W", "error", "-c", code], env=ENV, timeout=300)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert json.loads((tmp_path / "m.json").read_text())["last_loss"] == 6.0


def test_hf_target_progress_bars_only_when_asked(tmp_path):
    """One process (one import of transformers, not three): it saves a tiny Qwen3, loads it asking for progress,
    then loads it without asking; what each load said to stderr lies between the markers. The quiet load comes
    second, after a load that showed its bar, so the bar it lacks is one it turned off itself."""
    code = textwrap.dedent("""
        import sys, torch, transformers
        from dflash_launch.roles.hf_target import load_pretrained
        c = transformers.Qwen3Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1, head_dim=8)
        transformers.Qwen3ForCausalLM(c).save_pretrained(sys.argv[1])
        print("@@asked", file=sys.stderr, flush=True)
        load_pretrained(transformers, sys.argv[1], torch.float32, progress=True)
        print("@@quiet", file=sys.stderr, flush=True)
        load_pretrained(transformers, sys.argv[1], torch.float32, progress=False)
        print("@@end", file=sys.stderr, flush=True)
    """)
    r = run([PY, "-c", code, tmp_path / "model"], env=ENV, timeout=300)
    assert r.returncode == 0, r.stderr
    asked = r.stderr.split("@@asked\n")[1].split("@@quiet\n")[0]
    quiet = r.stderr.split("@@quiet\n")[1].split("@@end\n")[0]
    assert "Loading weights" in asked, r.stderr  # the bar this test is about exists
    assert "Loading weights" not in quiet, r.stderr


def test_seed_verify_on_a_script_that_only_uses_training_metrics(bin_dir, tmp_path):
    cfg = write_config(tmp_path, f"""
[[role]]
name = "drafter"
cpu = 1
command = ["{PY}", "{ROOT / 'tests/payloads/metrics_only_compile.py'}"]
env = {{ TORCHINDUCTOR_COMPILE_THREADS = "1" }}
gate = {{ timeout = "10m", mode = "serial" }}
ready = {{ mode = "notify", timeout = "10m" }}
""")
    seed = run([bin_dir / "dflash-launch", "seed", cfg], env=ENV, timeout=600)
    assert seed.returncode == 0, seed.stdout + seed.stderr
    v = run([bin_dir / "dflash-launch", "seed", cfg, "--verify"], env=ENV, timeout=600)
    assert v.returncode == 0 and "0 FX-graph misses" in v.stdout, v.stdout + v.stderr


def key_role():
    return f"""
[[role]]
name = "drafter"
cpu = 1
command = ["{PY}", "train.py"]
cwd = "work"
gate = true
"""


def test_the_key_follows_namespace_packages_and_names_what_it_cannot(bin_dir, tmp_path):
    work = tmp_path / "work"
    (work / "models" / "blocks").mkdir(parents=True)  # no __init__.py anywhere: namespace packages
    (work / "train.py").write_text("import models.drafter\n")
    (work / "models" / "drafter.py").write_text("from models.blocks import attention\n")
    (work / "models" / "blocks" / "attention.py").write_text("X = 1\n")
    cfg = write_config(tmp_path, key_role())
    r = run([bin_dir / "dflash-launch", "check", cfg, "--json"], env=ENV)
    assert r.returncode == 0, r.stderr
    files = {f["why"]: f for f in json.loads(r.stdout)["roles"][0]["gate"]["key_files"]}
    assert files["import models.drafter"]["path"] == str(work / "models" / "drafter.py"), files
    assert files["import models.blocks.attention"]["path"] == str(work / "models" / "blocks" / "attention.py"), files
    assert not any(f.get("note") for f in files.values()), files

    # Code it cannot read: named, with the key_files line that would cover it.
    (work / "models" / "blocks" / "attention.py").write_text("def broken(:\n")
    r = run([bin_dir / "dflash-launch", "check", cfg], env=ENV)
    assert r.returncode == 0, r.stderr
    assert "not followed: models.blocks.attention: SyntaxError at line 1; key that code by hand: " \
           'gate.key_files = ["models/blocks/*.py"]' in r.stdout, r.stdout


def test_training_metrics_keeps_the_mean_of_the_first_and_last_ten_losses(tmp_path):
    from dflash_launch.train_metrics import TrainingMetrics
    m = TrainingMetrics(path=str(tmp_path / "m.json"), every_s=1e9)
    for i in range(19):
        m.step(float(i))
    assert "first_loss_mean10" not in m.snapshot()  # the two windows would overlap
    for i in range(19, 25):
        m.step(float(i))
    snap = m.snapshot()
    assert (snap["first_loss"], snap["last_loss"]) == (0.0, 24.0)
    assert (snap["first_loss_mean10"], snap["last_loss_mean10"]) == (4.5, 19.5)
