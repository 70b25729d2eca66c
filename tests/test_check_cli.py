"""`dflash-launch check`: exit codes, the text plan and the stable --json plan."""
import json
import os
import sys

from conftest import ROOT, run


def test_valid_config_exits_0_and_prints_the_plan(bin_dir):
    r = run([bin_dir / "dflash-launch", "check", ROOT / "configs/demo.toml"])
    assert r.returncode == 0, r.stderr
    assert "drafter  input [1, 64, 320]" in r.stdout
    assert "drafter:2" in r.stdout


def test_config_error_exits_2_and_names_file_line_col(bin_dir):
    bad = ROOT / "tests/configs/bad/gpu_two_roles.toml"
    r = run([bin_dir / "dflash-launch", "check", bad])
    assert r.returncode == 2
    assert f"{bad}:14:15: error: role[drafter].devices: GPU 1 is used by two roles" in r.stderr
    assert f"{bad}:10:15" in r.stderr  # the other place GPU 1 is used
    assert "hint:" in r.stderr
    assert "set [run] share_gpus = true" in r.stderr  # the hint names the key that allows it on purpose
    assert r.stdout == ""


def test_missing_config_file_exits_2(bin_dir, tmp_path):
    r = run([bin_dir / "dflash-launch", "check", tmp_path / "nope.toml"])
    assert r.returncode == 2
    assert "cannot read the config" in r.stderr


def test_usage_errors_exit_64(bin_dir):
    assert run([bin_dir / "dflash-launch"]).returncode == 64
    assert run([bin_dir / "dflash-launch", "check"]).returncode == 64
    assert run([bin_dir / "dflash-launch", "check", "--no-such-flag", "x.toml"]).returncode == 64


def test_help_and_version_exit_0(bin_dir):
    r = run([bin_dir / "dflash-launch", "--help"])
    assert r.returncode == 0 and "check" in r.stdout
    r = run([bin_dir / "dflash-launch", "--version"])
    assert r.returncode == 0 and r.stdout.startswith("dflash-launch ")


def test_json_plan_is_stable_across_runs(bin_dir, tmp_path):
    # configs/dflash-8gpu.toml needs its checkpoint's path (tests/test_dflash_8gpu.py) and torch's python.
    env = dict(os.environ, DFLASH_TARGET_MODEL="/m", PATH=f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}",
               PYTHONPATH=str(ROOT / "python"))
    cmd = [bin_dir / "dflash-launch", "check", ROOT / "configs/dflash-8gpu.toml", "--json"]
    first, second = run(cmd, cwd=tmp_path, env=env), run(cmd, cwd=tmp_path, env=env)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert json.loads(first.stdout)["processes"] and first.stdout == second.stdout


def test_schema_markdown_is_what_the_docs_carry(bin_dir):
    r = run([bin_dir / "dflash-launch", "schema", "--markdown"])
    assert r.returncode == 0
    assert r.stdout in (ROOT / "docs/config.md").read_text()


def test_share_gpus_in_the_plan(bin_dir):
    """[run] share_gpus = true: 4 processes on GPU 0, said in the text plan and in --json; the demo says false."""
    cfg = ROOT / "tests/configs/good/shared_gpu.toml"
    r = run([bin_dir / "dflash-launch", "check", "--json", cfg])
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["run"]["share_gpus"] is True
    assert [(p["name"], p["gpu"], p["env"]["CUDA_VISIBLE_DEVICES"]) for p in plan["processes"]] == [
        ("target:0", 0, "0"), ("drafter:0", 0, "0"), ("drafter:1", 0, "0"), ("drafter:2", 0, "0")]
    r = run([bin_dir / "dflash-launch", "check", cfg])
    assert "gpus     shared: several processes may use one GPU" in r.stdout
    r = run([bin_dir / "dflash-launch", "check", "--json", ROOT / "configs/demo.toml"])
    assert json.loads(r.stdout)["run"]["share_gpus"] is False


def test_check_text_is_compact_and_json_keeps_the_file_lists(bin_dir, tmp_path):
    """Issue #39: `check` printed the gate key's file list inline, per process (247 lines for 8 processes of a
    model that imports a dozen modules). The text says each role's files in one line; `check --json` has every
    file and hash, and the warm-up's dflash-worker gets them by its --gate-sources flag (no process's environment
    carries them)."""
    import re
    pkg = tmp_path / "mymodel"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for i in range(12):
        (pkg / f"layer{i}.py").write_text(f"X = {i}\n")
    (tmp_path / "train.py").write_text("".join(f"import mymodel.layer{i}\n" for i in range(12)))

    def plan(n, *flags):
        cfg = tmp_path / f"run{n}.toml"
        cfg.write_text(f"""[run]
name = "t"
cache_dir = "cache"
log_dir = "runs"
[[role]]
name = "drafter"
cpu = {n}
command = ["python3", "train.py"]
cwd = "."
gate = true
world = "role"
""")
        (tmp_path / "cache").mkdir(mode=0o700, exist_ok=True)
        r = run([bin_dir / "dflash-launch", "check", cfg, *flags], cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        return r.stdout

    three, six = plan(3), plan(6)
    assert not re.search(r"(?m)^[0-9a-f]{64} ", three), three  # no file list, no hashes
    assert "key files 14: script train.py" in three and "check --json lists each" in three
    # Each further process costs its two lines (name, its own variables), never its files.
    assert len(six.splitlines()) - len(three.splitlines()) == 2 * 3
    assert len(three.splitlines()) < 80, len(three.splitlines())
    j = json.loads(plan(3, "--json"))
    assert not any("DFLASH_GATE_SOURCES" in p["env"] for p in j["processes"] + j["warmups"])
    (warmup,) = j["warmups"]
    sources = warmup["argv"][warmup["argv"].index("--gate-sources") + 1]
    assert len(sources.splitlines()) == 14  # the script, __init__ and 12 layers
    assert len(j["roles"][0]["gate"]["key_files"]) == 14
