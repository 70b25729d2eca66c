"""Everything a run writes is ours and private (issue #21, item 2): the log dir, the run dir, its attempt dirs and
files, and the spool. Another local user (made here with useradd, removed after) plants links and directories
where a run will write; the run refuses before anything is spawned and writes nothing through them. A run's files
are 0600 and its dirs 0700 whatever the umask, so another user cannot read its output; a reused run id is refused
unless --resume says to continue it."""
import json
import os
import pathlib
import shutil
import stat
import subprocess
import sys
import tempfile
import uuid

import pytest

from conftest import run
from supervise import write_config

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a second local user is made with useradd")


@pytest.fixture
def other_user():
    """A throw-away local user (and its private group), removed at the end of the test."""
    if shutil.which("useradd") is None:
        pytest.skip("no useradd")
    name = "dft" + uuid.uuid4().hex[:8]
    r = run(["useradd", "--no-create-home", "--shell", "/bin/sh", "--user-group", name])
    if r.returncode != 0:
        pytest.skip(f"useradd failed: {r.stderr.strip()}")
    import pwd
    pw = pwd.getpwnam(name)
    try:
        yield pw
    finally:
        run(["userdel", name])
        run(["groupdel", name])  # --user-group's group, if userdel left it


def as_user(pw, args, **kw):
    """`args` run as that user (its own uid and group, no supplementary groups, a private XDG_RUNTIME_DIR)."""
    xdg = tempfile.mkdtemp(prefix="dflash-xdg-")
    os.chown(xdg, pw.pw_uid, pw.pw_gid)
    env = {"PATH": "/usr/bin:/bin", "HOME": "/", "XDG_RUNTIME_DIR": xdg}
    try:
        return run(args, user=pw.pw_uid, group=pw.pw_gid, extra_groups=[], env=env, cwd="/", **kw)
    finally:
        shutil.rmtree(xdg, ignore_errors=True)


@pytest.fixture
def shared_dir():
    """A shared sticky log dir, like /tmp: every user may make entries in it."""
    d = pathlib.Path(tempfile.mkdtemp(prefix="dflash-shared-"))
    d.chmod(0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def config(tmp_path, log_dir, body, name=None, extra=""):
    name = name or "rf" + uuid.uuid4().hex[:8]
    path = write_config(tmp_path, body, name=name)
    text = path.read_text().replace('log_dir = "runs"', f'log_dir = "{log_dir}"\n{extra}')
    path.write_text(text)
    return path


def role(command):
    return f"""
[[role]]
name = "a"
cpu = 1
command = ["sh", "-c", {json.dumps(command)}]
"""


def launch(bin_dir, cfg, run_id, *args, umask=None):
    pre = (lambda: os.umask(umask)) if umask is not None else None
    return run([bin_dir / "dflash-launch", "run", cfg, "--run-id", run_id, "--color", "never", *args],
               preexec_fn=pre)


@pytest.mark.parametrize("planted", ["attempt_0/a-0.stdout.log", "supervisor.log", "events.jsonl", "<run_id>"])
def test_links_another_user_planted_in_a_shared_log_dir_are_refused(bin_dir, tmp_path, other_user, shared_dir,
                                                                      planted):
    """The attack: in a shared sticky log_dir another user pre-made <run_id>/ (or <run_id> itself as a link) with
    links to a root 0600 file (or a root 0700 dir). Before: the payload's output, the supervisor log and events
    were appended there. Now: refused (exit 73) naming the other user, nothing spawned, the victim unchanged."""
    victim = tmp_path / "victim"
    victim.write_text("root's secret\n")
    victim.chmod(0o600)
    victim_dir = tmp_path / "victim_dir"
    victim_dir.mkdir(mode=0o700)
    marker = tmp_path / "spawned"
    cfg = config(tmp_path, shared_dir, role(f"echo payload-output; touch {marker}"))
    rid = "r" + uuid.uuid4().hex[:6]
    if planted == "<run_id>":
        plant = f"ln -s {victim_dir} {shared_dir}/{rid}"
    else:
        plant = (f"mkdir -m 0777 -p {shared_dir}/{rid}/attempt_0 && "
                 f"ln -s {victim} {shared_dir}/{rid}/{planted}")
    r = as_user(other_user, ["sh", "-c", plant])
    assert r.returncode == 0, r.stderr

    r = launch(bin_dir, cfg, rid)
    assert victim.read_text() == "root's secret\n"
    assert sorted(p.name for p in victim_dir.iterdir()) == []
    assert not marker.exists(), "a process was spawned"
    assert r.returncode == 73, (r.returncode, r.stdout, r.stderr)
    assert "refusing run dir" in r.stderr, r.stderr
    assert other_user.pw_name in r.stderr, r.stderr  # names whose link or dir it is
    # `check --run-id` says the same before any run.
    c = run([bin_dir / "dflash-launch", "check", cfg, "--run-id", rid])
    assert c.returncode == 2, (c.returncode, c.stdout, c.stderr)
    assert "refusing run dir" in c.stdout + c.stderr


def test_a_log_dir_others_can_write_without_sticky_bit_is_a_config_error(bin_dir, tmp_path):
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)  # anyone could swap <run_id>/ for a link of theirs
    marker = tmp_path / "spawned"
    cfg = config(tmp_path, open_dir, role(f"touch {marker}"))
    r = launch(bin_dir, cfg, "r1")
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "log_dir" in r.stderr and "chmod +t" in r.stderr, r.stderr
    assert str(cfg) in r.stderr  # file:line:col of the key
    assert not marker.exists()


def test_every_file_and_dir_a_run_writes_is_private_whatever_the_umask(bin_dir, tmp_path):
    """Files 0600, dirs 0700, from the log dir down, even under umask 000 (before: 0644/0755 and the umask's)."""
    cfg = config(tmp_path, tmp_path / "logs", role("echo out; echo err >&2; exit 3") +
                 'restart = { policy = "on-failure", max = 1, window = "1h", backoff = "10ms..10ms" }\n')
    r = launch(bin_dir, cfg, "modes", umask=0)
    assert r.returncode == 3, (r.returncode, r.stderr)
    run_dir = tmp_path / "logs" / "modes"
    seen = {}
    for p in [tmp_path / "logs", *sorted(run_dir.rglob("*")), run_dir]:
        st = p.lstat()
        assert not stat.S_ISLNK(st.st_mode), p
        seen[str(p.relative_to(tmp_path))] = oct(stat.S_IMODE(st.st_mode))
        want = 0o700 if stat.S_ISDIR(st.st_mode) else 0o600
        assert stat.S_IMODE(st.st_mode) == want, (p, oct(st.st_mode))
    for f in ("supervisor.log", "events.jsonl", "summary.json", "run.lock", "guardian.log",
              "attempt_0/a-0.stdout.log", "attempt_1/a-0.stderr.log"):
        assert f"logs/modes/{f}" in seen, (f, sorted(seen))


def test_another_user_cannot_read_a_runs_logs_unless_log_group_shares_them(bin_dir, tmp_path, other_user,
                                                                            shared_dir):
    cfg = config(tmp_path, shared_dir, role("echo the-secret-output"))
    r = launch(bin_dir, cfg, "private")
    assert r.returncode == 0, r.stderr
    launcher = str(bin_dir / "dflash-launch")
    seen = as_user(other_user, [launcher, "ctl", f"{shared_dir}/private", "logs", "all"])
    assert "the-secret-output" not in seen.stdout + seen.stderr
    assert seen.returncode != 0
    cat = as_user(other_user, ["cat", f"{shared_dir}/private/attempt_0/a-0.stdout.log"])
    assert cat.returncode != 0 and "the-secret-output" not in cat.stdout
    # The owner reads them.
    mine = run([launcher, "ctl", f"{shared_dir}/private", "logs", "all"])
    assert "the-secret-output" in mine.stdout, mine.stderr

    # log_group: that group (here the other user's own) may read them, and nobody may write.
    import grp
    group = grp.getgrgid(other_user.pw_gid).gr_name
    (tmp_path / "g").mkdir()
    cfg2 = config(tmp_path / "g", shared_dir, role("echo the-shared-output"), extra=f'log_group = "{group}"')
    r = launch(bin_dir, cfg2, "shared")
    assert r.returncode == 0, r.stderr
    seen = as_user(other_user, [launcher, "ctl", f"{shared_dir}/shared", "logs", "all"])
    assert "the-shared-output" in seen.stdout, (seen.returncode, seen.stderr)
    st = (shared_dir / "shared" / "attempt_0" / "a-0.stdout.log").stat()
    assert (stat.S_IMODE(st.st_mode), st.st_gid) == (0o640, other_user.pw_gid)
    st = (shared_dir / "shared").stat()
    assert (stat.S_IMODE(st.st_mode), st.st_gid) == (0o750, other_user.pw_gid)


def test_log_group_must_exist(bin_dir, tmp_path):
    cfg = config(tmp_path, tmp_path / "logs", role("true"), extra='log_group = "no-such-group-dflash"')
    r = run([bin_dir / "dflash-launch", "check", cfg])
    assert r.returncode == 2
    assert "run.log_group" in r.stderr + r.stdout and "no such group" in r.stderr + r.stdout


def test_a_spool_dir_another_user_made_first_is_refused(bin_dir, tmp_path, other_user):
    """Another user pre-creates /dev/shm/dflash-0-<name>/<run_id> 0777 (the default spool); before, the target
    took it (EEXIST is success) and that user could swap weights.safetensors and ready/ frames mid-run. A
    spool_dir named in the config that is theirs is refused (exit 2); the default name, which anyone can guess,
    is not used either, but no longer blocks the run (issue #38): an unguessable one is used, with a warning."""
    name = "rf" + uuid.uuid4().hex[:8]
    spool = pathlib.Path(f"/dev/shm/dflash-{os.getuid()}-{name}")
    try:
        r = as_user(other_user, ["sh", "-c", f"mkdir -m 0777 {spool} {spool}/sp && chmod 0777 {spool} {spool}/sp"])
        assert r.returncode == 0, r.stderr
        marker = tmp_path / "spawned"
        cfg = config(tmp_path, tmp_path / "logs", role(f"touch {marker}"), name=name, extra=f'spool_dir = "{spool}"')
        r = launch(bin_dir, cfg, "sp")
        assert r.returncode == 2, (r.returncode, r.stderr)
        assert "spool_dir" in r.stderr and other_user.pw_name in r.stderr, r.stderr
        assert not marker.exists()
        cfg = config(tmp_path, tmp_path / "logs", role(f"touch {marker}"), name=name)
        r = launch(bin_dir, cfg, "sp")
        assert r.returncode == 0, (r.returncode, r.stderr)
        assert "warning: run.spool_dir" in r.stderr and other_user.pw_name in r.stderr, r.stderr
        assert marker.exists() and not os.listdir(spool / "sp")
        # The spool code itself (what the builtin roles and a Python target run) refuses it too.
        code = ("import sys; from dflash_launch.spool import Paths, SpoolError\n"
                "try:\n    Paths(sys.argv[1]).create()\nexcept SpoolError as e:\n    print(e); sys.exit(9)\n")
        env = dict(os.environ, PYTHONPATH=str(pathlib.Path(__file__).parent.parent / "python"))
        py = run([sys.executable, "-c", code, f"{spool}/sp"], env=env)
        assert py.returncode == 9 and "refusing spool dir" in py.stdout, (py.returncode, py.stdout, py.stderr)
        assert not (spool / "sp" / "ready").exists()
    finally:
        shutil.rmtree(spool, ignore_errors=True)
        for d in pathlib.Path("/dev/shm").glob(f"{spool.name}-*"):
            shutil.rmtree(d, ignore_errors=True)


def test_a_private_spool_is_made_0700(tmp_path):
    sys.path.insert(0, str(pathlib.Path(__file__).parent.parent / "python"))
    from dflash_launch.spool import Paths
    old = os.umask(0)
    try:
        Paths(tmp_path / "a" / "b").create()
    finally:
        os.umask(old)
    for d in [tmp_path / "a", tmp_path / "a" / "b", *(tmp_path / "a" / "b").iterdir()]:
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d


def test_a_reused_run_id_is_refused_and_resume_continues_it(bin_dir, tmp_path):
    cfg = config(tmp_path, tmp_path / "logs", role("echo attempt-output-$DFLASH_ATTEMPT"))
    run_dir = tmp_path / "logs" / "again"
    assert launch(bin_dir, cfg, "again").returncode == 0
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != "run.lock"}

    r = launch(bin_dir, cfg, "again")
    assert r.returncode == 69, (r.returncode, r.stderr)
    assert "was used before" in r.stderr and "--resume" in r.stderr, r.stderr
    assert {p: p.read_bytes() for p in before} == before  # nothing appended, nothing rewritten
    assert sorted(d.name for d in run_dir.glob("attempt_*")) == ["attempt_0"]

    r = launch(bin_dir, cfg, "again", "--resume")
    assert r.returncode == 0, r.stderr
    assert sorted(d.name for d in run_dir.glob("attempt_*")) == ["attempt_0", "attempt_1"]
    assert (run_dir / "attempt_0" / "a-0.stdout.log").read_bytes() == before[run_dir / "attempt_0" / "a-0.stdout.log"]
    assert "attempt-output-0" in (run_dir / "attempt_1" / "a-0.stdout.log").read_text()
    events = (run_dir / "events.jsonl").read_bytes()
    old = before[run_dir / "events.jsonl"]
    assert events.startswith(old)
    new = [json.loads(line) for line in events[len(old):].splitlines()]
    assert new[0]["event"] == "resume" and new[0]["attempt_base"] == 1, new[0]
    assert any(e.get("process") == "a:0" and e.get("to") == "EXITED" for e in new[1:])
    log = (run_dir / "supervisor.log").read_text()
    assert log.startswith(before[run_dir / "supervisor.log"].decode()) and "resumed run again" in log
    assert json.loads((run_dir / "summary.json").read_text())["exit_code"] == 0

    # --resume of a run id never used starts it.
    r = launch(bin_dir, cfg, "fresh", "--resume")
    assert r.returncode == 0, r.stderr
    assert sorted(d.name for d in (tmp_path / "logs" / "fresh").glob("attempt_*")) == ["attempt_0"]
