"""The suite keeps to itself (tests/conftest.py): its runs are in a registry of the session's own, so a user's
`dflash-launch ps` never lists them, and the /dev/shm objects of its test caches' gates are named as the gate
names them, so the end-of-session sweep removes exactly those."""
import json
import os

from conftest import USER_XDG_RUNTIME_DIR, gate_objects_of, run
from supervise import write_config


def test_the_suites_runs_are_not_in_the_users_registry(launch, bin_dir, tmp_path):
    cfg = write_config(tmp_path, '[[role]]\nname = "a"\ncpu = 1\ncommand = ["sleep", "60"]\n')
    r = launch(cfg)
    r.wait_for_log("all 1 processes are running")
    mine = run([bin_dir / "dflash-launch", "ps", "--json"])
    assert mine.returncode == 0, mine.stderr
    assert [x["pid"] for x in json.loads(mine.stdout)] == [r.pid]
    user_env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    if USER_XDG_RUNTIME_DIR:
        user_env["XDG_RUNTIME_DIR"] = USER_XDG_RUNTIME_DIR
    theirs = run([bin_dir / "dflash-launch", "ps", "--json"], env=user_env)
    assert theirs.returncode == 0, theirs.stderr
    assert r.pid not in [x["pid"] for x in json.loads(theirs.stdout)]


def test_the_sweep_names_a_gates_objects_as_the_gate_does(bin_dir, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    r = run([bin_dir / "dflash-cachelock-run", cache, "--key", "k", "--", "true"])
    assert r.returncode == 0, r.stderr
    sem, owner = gate_objects_of(cache)
    assert os.path.exists(sem), sorted(os.listdir("/dev/shm"))
    for path in (sem, owner):  # what the session's end would do, done here so the check is this test's
        if os.path.exists(path):
            os.unlink(path)
