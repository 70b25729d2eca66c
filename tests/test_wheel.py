"""The wheel (`make wheel`; run by `make test-wheel`, which .ci/run calls after `make test`): manylinux-tagged,
under 30 MB, installed into a fresh venv with --no-index, and used from the installed copy only: --version,
`check configs/demo.toml`, and a gated CPU run whose payloads import the installed dflash_launch and get the
venv's python although the venv is not on PATH."""
import glob
import json
import os
import re
import sys
import tarfile
import zipfile

import pytest

from conftest import ROOT, run
from gpu_check_report import check_cpu_report

WHEEL = os.environ.get("DFLASH_WHEEL", "")
pytestmark = pytest.mark.skipif(not WHEEL, reason="`make test-wheel` builds the wheel and runs these")
BINARIES = ("dflash-launch", "dflash-worker", "dflash-cachelock", "dflash-cachelock-run", "dflash-guardian")
# dflash-guardian is started by dflash-launch from beside itself (no console script of its own).
CONSOLE_SCRIPTS = BINARIES[:4]
GLIBC = {"libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1", "ld-linux-x86-64.so.2"}


def test_wheel_is_manylinux_small_and_complete():
    name = os.path.basename(WHEEL)
    assert re.fullmatch(r"dflash_launch-0\.1\.0-py3-none-manylinux_2_\d+_x86_64\.whl", name), name
    assert os.path.getsize(WHEEL) < 30 * 2**20
    r = run([ROOT / ".venv-wheel" / "bin" / "auditwheel", "show", WHEEL])  # make wheel's tools (scripts/setup)
    assert r.returncode == 0, r.stderr
    tag = re.search(r"manylinux_2_\d+_x86_64", name).group(0)
    assert f'"{tag}"' in " ".join(r.stdout.split()), r.stdout  # auditwheel agrees with the tag
    with zipfile.ZipFile(WHEEL) as z:
        names = set(z.namelist())
        entry_points = z.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
        for b in BINARIES:
            info = z.getinfo(f"dflash_launch/bin/{b}")
            assert (info.external_attr >> 16) & 0o111, f"{b} is not executable in the wheel"
            if b in CONSOLE_SCRIPTS:
                assert re.search(rf"^{b} = dflash_launch\._bin:", entry_points, re.M), entry_points
        assert "dflash_launch/lib/libdflash_spool.so" in names  # the spool's C ABI, which the package loads
    # Every module of the package, its subpackages included (the spool, the roles, the tools, the Inductor hook).
    modules = run(["git", "-C", ROOT, "ls-files", "python/dflash_launch/*.py"]).stdout.split()
    assert {"python/dflash_launch/roles/reference_drafter.py", "python/dflash_launch/spool/__init__.py"} <= set(modules)
    assert {m[len("python/"):] for m in modules} <= names, sorted({m[len("python/"):] for m in modules} - names)
    assert not any("dflash-builtin" in n for n in names)  # a source build only (docs/wheel.md)
    # configs/ and examples/ as package data: every file the checkout tracks there, and nothing else of them
    tracked = run(["git", "-C", ROOT, "ls-files", "configs", "examples"]).stdout.split()
    assert "examples/ddp-spool/drafter.py" in tracked and "configs/demo.toml" in tracked, tracked
    shipped = {n[len("dflash_launch/"):] for n in names
               if n.startswith(("dflash_launch/configs/", "dflash_launch/examples/")) and not n.endswith("/")}
    assert shipped == set(tracked)


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A fresh venv without pip; the wheel installed into it by pip --python, from the file only."""
    d = tmp_path_factory.mktemp("wheel") / "venv"
    r = run([sys.executable, "-m", "venv", "--without-pip", d], timeout=120)
    assert r.returncode == 0, r.stderr
    r = run([sys.executable, "-m", "pip", "--python", d / "bin" / "python", "install", "--no-index", "--no-deps",
             "--disable-pip-version-check", "-q", WHEEL], timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    site = glob.glob(str(d / "lib" / "python3*" / "site-packages"))[0]
    return {"dir": d, "site": site, "python": str(d / "bin" / "python"),
            "env": dict({k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
                        PATH="/usr/bin:/bin")}


def test_installed_binaries_need_only_glibc_and_what_the_wheel_carries(venv):
    libs = os.path.join(venv["site"], "dflash_launch.libs")
    for b in BINARIES:
        path = os.path.join(venv["site"], "dflash_launch", "bin", b)
        r = run(["ldd", path])
        assert r.returncode == 0 and "not found" not in r.stdout, r.stdout
        for line in r.stdout.splitlines():
            parts = line.split()
            if "=>" not in parts or parts[0].startswith("linux-vdso"):
                continue
            target = os.path.realpath(parts[parts.index("=>") + 1])
            # dflash-launch, dflash-guardian (the supervisor's) and the prometheus-cpp they carry share the system's
            # libstdc++ (manylinux whitelist, as libz is; its symbol versions are in the tag's policy: auditwheel
            # show, above). The others have the runtime static.
            serves_metrics = b in ("dflash-launch", "dflash-guardian")
            system = GLIBC | ({"libstdc++.so.6", "libgcc_s.so.1", "libz.so.1"} if serves_metrics else set())
            assert parts[0] in system or target.startswith(libs), f"{b} needs {line.strip()} from the system"


def test_installed_version_and_check_of_the_demo_config(venv):
    launch = str(venv["dir"] / "bin" / "dflash-launch")
    r = run([launch, "--version"], env=venv["env"])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "dflash-launch 0.1.0"
    assert re.fullmatch(r"commit [0-9a-f]{12}(-dirty)?", lines[1]), lines
    assert re.fullmatch(r"tested with torch \d+\.\d+\.\d+\S*", lines[2]), lines
    assert "Release" in lines[3] and "portable" in lines[3] and "without dflash-builtin" in lines[3], lines
    r = run([launch, "check", ROOT / "configs/demo.toml"], env=venv["env"])
    assert r.returncode == 0, r.stderr
    assert "drafter  input [1, 64, 320]" in r.stdout
    # its builtin targets need dflash-builtin, which the wheel leaves out: check warns, run refuses up front
    assert "warning: role[target].builtin: dflash-builtin is not installed beside dflash-launch" in r.stderr
    r = run([launch, "check", "--json", ROOT / "configs/demo.toml"], env=venv["env"])
    plan = json.loads(r.stdout)
    # The drafters' warm-up (gate mode warmup) runs under the wheel's own dflash-worker.
    (warmup,) = plan["warmups"]
    assert warmup["argv"][0] == os.path.join(venv["site"], "dflash_launch", "bin", "dflash-worker")


def test_installed_run_of_a_builtin_role_refuses_before_spawning(venv, tmp_path):
    (tmp_path / "cache").mkdir(mode=0o700)
    config = tmp_path / "demo.toml"
    text = (ROOT / "configs/demo.toml").read_text()
    text = re.sub(r'(?m)^cache_dir = .*$', f'cache_dir = "{tmp_path}/cache"', text)
    config.write_text(re.sub(r'(?m)^log_dir = .*$', f'log_dir = "{tmp_path}/runs"', text))
    r = run([venv["dir"] / "bin" / "dflash-launch", "run", config], env=venv["env"])
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{config}:" in r.stderr and "error: role[target].builtin: dflash-builtin is not installed" in r.stderr
    assert "docs/wheel.md" in r.stderr and "nothing was started." in r.stderr
    assert not (tmp_path / "runs").exists()  # no run directory, no process


PAYLOAD = """import json, os, sys
hooked = any(m.startswith("dflash_launch") for m in sys.modules)  # nothing of ours loads before the script's import
import dflash_launch
out = {"python": sys.executable, "package": dflash_launch.__file__, "gate_role": dflash_launch.gate_role(),
       "hooked": hooked}
with open(os.path.join(os.environ["OUT"], os.environ["DFLASH_PROCESS"].replace(":", "-") + ".json"), "w") as f:
    json.dump(out, f)
# A stand-in compile: its output lands in the cache (a leader that wrote nothing publishes no READY).
open(os.path.join(os.environ["TORCHINDUCTOR_CACHE_DIR"], "kernel." + os.environ["DFLASH_PROCESS"]), "w").write("k")
dflash_launch.notify_ready("payload ready")
"""


def test_installed_gated_cpu_run(venv, tmp_path):
    (tmp_path / "cache").mkdir(mode=0o700)
    (tmp_path / "out").mkdir()
    (tmp_path / "payload.py").write_text(PAYLOAD)
    config = tmp_path / "run.toml"
    config.write_text(f"""[run]
name = "wheel"
cache_dir = "{tmp_path}/cache"
log_dir = "{tmp_path}/runs"

[[role]]
name = "drafter"
cpu = 3
command = ["python", "{tmp_path}/payload.py"]
env = {{ OUT = "{tmp_path}/out" }}
gate = {{ timeout = "2m", mode = "serial" }}
ready = {{ mode = "notify", timeout = "2m" }}
""")
    r = run([venv["dir"] / "bin" / "dflash-launch", "run", config, "--run-id", "w", "--color", "never"],
            env=venv["env"], timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads((tmp_path / "runs" / "w" / "summary.json").read_text())
    assert [p["exit_code"] for p in summary["processes"]] == [0, 0, 0]
    outs = [json.loads((tmp_path / "out" / f"drafter-{i}.json").read_text()) for i in range(3)]
    assert sorted(o["gate_role"] for o in outs) == ["lead", "reuse", "reuse"]
    for o in outs:
        # `python` of the config is the venv's although the venv is not on PATH: the console script put it first
        assert o["python"] == venv["python"], o
        assert o["package"].startswith(venv["site"]), o
        assert o["hooked"] is False, o  # no .pth hook: nothing patches torch behind the script (issue #44)
    assert not os.path.exists(os.path.join(venv["site"], "dflash_launch_hook.pth"))
    plan = json.loads(run([venv["dir"] / "bin" / "dflash-launch", "check", "--json", config], env=venv["env"]).stdout)
    assert "precompile" not in plan["roles"][0]["gate"], plan["roles"][0]["gate"]


def test_installed_launcher_serves_the_metrics(venv, tmp_path):
    """The wheel's dflash-launch serves what the source build serves (issue #59 item 1): prometheus-cpp and
    civetweb come grafted in dflash_launch.libs/, nothing from the checkout or the system but glibc and libstdc++."""
    import subprocess
    import time
    import urllib.request
    (tmp_path / "cache").mkdir(mode=0o700)
    stop = tmp_path / "stop"
    config = tmp_path / "run.toml"
    config.write_text(f"""[run]
name = "wheel-metrics"
cache_dir = "{tmp_path}/cache"
log_dir = "{tmp_path}/runs"
metrics = "127.0.0.1:0"

[[role]]
name = "p"
cpu = 2
command = ["sh", "-c", "while [ ! -e {stop} ]; do sleep 0.1; done"]
""")
    launch = venv["dir"] / "bin" / "dflash-launch"
    r = run([launch, "check", config], env=venv["env"])
    assert r.returncode == 0 and "metrics" not in r.stderr, r.stderr  # nothing to warn about: they are served
    proc = subprocess.Popen([str(launch), "run", str(config), "--run-id", "m", "--color", "never"], env=venv["env"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url_file = tmp_path / "runs" / "m" / "metrics.url"
        deadline = time.monotonic() + 120
        while not url_file.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert url_file.exists(), proc.poll()
        url = url_file.read_text().strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/metrics", url), url
        up = ""
        while time.monotonic() < deadline:  # RUNNING once both have started
            with urllib.request.urlopen(url, timeout=10) as resp:
                text = resp.read().decode()
            up = sorted(l for l in text.splitlines() if l.startswith("dflash_process_up{"))
            if up == ['dflash_process_up{process="p:0",role="p"} 1', 'dflash_process_up{process="p:1",role="p"} 1']:
                break
            time.sleep(0.2)
        assert up == ['dflash_process_up{process="p:0",role="p"} 1', 'dflash_process_up{process="p:1",role="p"} 1'], \
            text
        assert "# TYPE dflash_process_up gauge" in text
    finally:
        stop.touch()
        try:
            out = proc.communicate(timeout=60)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            out = proc.communicate()[0]
    assert proc.returncode == 0, out
    assert "without prometheus-cpp" not in out, out


def test_installed_init_writes_a_starter_outside_the_checkout(venv, tmp_path):
    """`dflash-launch init NAME` from the installed copy, in a directory that is not the checkout: the starter comes
    from the wheel's own examples/, `check` accepts it without a warning (no dflash-builtin needed), and a second
    init overwrites nothing."""
    launch = str(venv["dir"] / "bin" / "dflash-launch")
    r = run([launch, "init", "starter"], env=venv["env"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    installed = os.path.join(venv["site"], "dflash_launch", "examples", "ddp-spool", "drafter.py")
    assert (tmp_path / "starter" / "drafter.py").read_bytes() == open(installed, "rb").read()
    text = (tmp_path / "starter" / "run.toml").read_text()
    assert 'name = "starter"' in text and "dflash_launch.roles.hf_target" in text and "builtin" not in text.split("[run]")[1]
    r = run([launch, "check", "starter/run.toml"], env=venv["env"], cwd=tmp_path)
    assert r.returncode == 0 and "warning" not in r.stderr, r.stdout + r.stderr
    assert f"cache    {tmp_path}/starter/cache" in r.stdout
    (tmp_path / "starter" / "run.toml").write_text("# edited\n")
    r = run([launch, "init", "starter"], env=venv["env"], cwd=tmp_path)
    assert r.returncode == 1 and "exists; nothing was written" in r.stderr, r.stderr
    assert (tmp_path / "starter" / "run.toml").read_text() == "# edited\n"


def test_installed_starter_runs_outside_the_checkout(venv, tmp_path):
    """The starter of `dflash-launch init` (examples/ddp-spool with a Python target) runs from the installed copy,
    outside the checkout: 2 hf_target processes publish, 3 DDP ranks of drafter.py train behind the gate. torch and
    transformers are the user's own in the venv (docs/wheel.md); here, offline, the test venv reaches the test
    interpreter's (CPU torch) through a .pth line, after its own site-packages, so dflash_launch is the wheel's."""
    import torch
    import transformers
    deps = {os.path.dirname(os.path.dirname(m.__file__)) for m in (torch, transformers)}
    pth = os.path.join(venv["site"], "zz_user_torch.pth")
    with open(pth, "w") as f:
        f.write("\n".join(sorted(deps)) + "\n")
    try:
        r = run([venv["python"], "-c", "import dflash_launch, torch; print(dflash_launch.__file__)"], env=venv["env"])
        assert r.returncode == 0 and r.stdout.startswith(venv["site"]), r.stdout + r.stderr
        launch = str(venv["dir"] / "bin" / "dflash-launch")
        assert run([launch, "init", "s"], env=venv["env"], cwd=tmp_path).returncode == 0
        r = run([launch, "run", "s/run.toml", "--run-id", "w", "--color", "never"], env=venv["env"], cwd=tmp_path,
                timeout=900)
        assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
        summary = json.loads((tmp_path / "s" / "runs" / "w" / "summary.json").read_text())
        procs = {p["name"]: p for p in summary["processes"]}
        assert sorted(procs) == ["drafter:0", "drafter:1", "drafter:2", "target:0", "target:1"], sorted(procs)
        assert {p["exit_code"] for p in procs.values()} == {0}, procs
        assert sum(procs[f"target:{i}"]["metrics"]["frames"] for i in range(2)) == 50
        # 50 frames over 3 ranks: 17 steps each, one padded; the ranks reused the warm-up's kernels
        assert sorted(procs[f"drafter:{i}"]["metrics"]["frames_acked"] for i in range(3)) == [16, 17, 17]
        assert {procs[f"drafter:{i}"]["gate"]["role"] for i in range(3)} == {"reuse"}
    finally:
        os.unlink(pth)


def test_gpu_check_bundle_runs_from_the_wheel_in_cpu_mode(tmp_path):
    """The bundle of `make gpu-check-bundle` (what a GPU machine gets): small, one command, and the check runs
    from the wheel it carries (not from this checkout), here in its CPU mode."""
    bundle = os.environ.get("DFLASH_GPU_BUNDLE", "")
    assert bundle and os.path.getsize(bundle) < 64 * 2**20
    with tarfile.open(bundle) as t:
        assert sorted(m.name for m in t.getmembers() if m.isfile()) == sorted([
            "dflash-gpu-check/" + os.path.basename(WHEEL), "dflash-gpu-check/dflash-8gpu.toml",
            "dflash-gpu-check/gpu-check"])
        t.extractall(tmp_path)
    out = tmp_path / "gc"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env.update(PYTHON=sys.executable, PATH="/usr/bin:/bin")
    r = run([tmp_path / "dflash-gpu-check" / "gpu-check", out, "--steps", "1", "--timeout", "600"], env=env,
            cwd=tmp_path, timeout=1500)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads((out / "check" / "report.json").read_text())
    check_cpu_report(report, r.stdout, (out / "check" / "summary.txt").read_text(), out / "site" / "dflash_launch",
                     steps=1)
    assert report["dflash_launch"]["launcher"] == str(out / "site" / "dflash_launch" / "bin" / "dflash-launch")
    e = report["checks"]["pipeline"]  # (e): the bundled 8-GPU config, scaled; not run where transformers is missing
    assert e["ok"] is True or (e["ok"] is None and "transformers" in e["note"]), e
    r = run([tmp_path / "dflash-gpu-check" / "gpu-check", out], env=env, cwd=tmp_path)
    assert r.returncode == 64 and "exists" in r.stderr  # a second run never overwrites the first report
