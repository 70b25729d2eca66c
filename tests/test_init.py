"""`dflash-launch init NAME` (python/dflash_launch/tools/starter.py, answered by the wheel's entry point before it execs the
binary): a starter NAME/run.toml + drafter.py from examples/ddp-spool that `check` accepts and that needs no
dflash-builtin; nothing that exists is overwritten. tests/test_wheel.py runs it from the installed wheel."""
import os
import sys
import tomllib

from conftest import BIN, ROOT, run

ENTRY = "import sys; from dflash_launch._bin import dflash_launch; sys.argv[0] = 'dflash-launch'; dflash_launch()"


def init(cwd, *args):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    return run([sys.executable, "-c", ENTRY, "init", *args], cwd=cwd, env=env)


def test_init_writes_a_starter_that_check_accepts(tmp_path):
    r = init(tmp_path, "my-run")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[:2] == ["wrote my-run/run.toml", "wrote my-run/drafter.py"]
    config = tomllib.loads((tmp_path / "my-run" / "run.toml").read_text())
    assert config["run"]["name"] == "my-run"
    assert (config["run"]["cache_dir"], config["run"]["log_dir"]) == ("cache", "runs")
    target, drafter = config["role"]
    # no builtin role: the wheel has no dflash-builtin; the Python target produces the frames instead
    assert "builtin" not in target and target["spool"] == "produce"
    assert target["command"][:3] == ["python", "-m", "dflash_launch.roles.hf_target"]
    assert drafter["command"] == ["python", "drafter.py"] and drafter["spool"] == "consume"
    shipped = tomllib.loads((ROOT / "examples/ddp-spool/run.toml").read_text())
    assert config["model"] == shipped["model"] and drafter == shipped["role"][1]
    assert (tmp_path / "my-run/drafter.py").read_bytes() == (ROOT / "examples/ddp-spool/drafter.py").read_bytes()
    r = run([BIN / "dflash-launch", "check", tmp_path / "my-run/run.toml"])
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr, r.stderr
    assert f"cache    {tmp_path}/my-run/cache" in r.stdout and "target    2 on cpu" in r.stdout


def test_init_never_overwrites(tmp_path):
    assert init(tmp_path, "a").returncode == 0
    before = {p: p.read_bytes() for p in (tmp_path / "a").iterdir()}
    (tmp_path / "a" / "run.toml").write_text("# mine\n")
    r = init(tmp_path, "a")
    assert r.returncode == 1 and "a/run.toml, a/drafter.py: exists; nothing was written" in r.stderr, r.stderr
    assert (tmp_path / "a" / "run.toml").read_text() == "# mine\n"
    assert (tmp_path / "a" / "drafter.py").read_bytes() == before[tmp_path / "a" / "drafter.py"]
    # one of the two there is enough: the other is not written either
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "drafter.py").write_text("mine")
    r = init(tmp_path, "b")
    assert r.returncode == 1 and "b/drafter.py: exists" in r.stderr, r.stderr
    assert sorted(os.listdir(tmp_path / "b")) == ["drafter.py"] and (tmp_path / "b/drafter.py").read_text() == "mine"
    # a dangling symlink counts as there: nothing is written through it
    (tmp_path / "c").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "c" / "run.toml")
    assert init(tmp_path, "c").returncode == 1 and not (tmp_path / "elsewhere").exists()


def test_init_refuses_a_file_and_a_bad_name(tmp_path):
    (tmp_path / "f").write_text("x")
    r = init(tmp_path, "f")
    assert r.returncode == 1 and "f: exists and is not a directory" in r.stderr, r.stderr
    for bad in (".hidden", "-x", "a b", "x" * 65):
        r = init(tmp_path, bad)
        assert r.returncode != 0 and "error" in r.stderr, (bad, r.stderr)
    assert sorted(os.listdir(tmp_path)) == ["f"]
    r = init(tmp_path)
    assert r.returncode == 2 and "NAME" in r.stderr  # argparse's usage error
