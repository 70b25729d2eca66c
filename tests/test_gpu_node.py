"""Issue #25 on a host without a GPU: the launcher's view of GPUs through a stand-in NVML
(tests/fixtures/nvml_stub.cc, built as build/testlib/libnvidia-ml.so.1 and found through
LD_LIBRARY_PATH like the real one), and what real processes are given: their GPU as nvidia-smi
names it, the inherited CUDA_VISIBLE_DEVICES indexed rather than overwritten, one compile pool."""
import json
import os
import sys

import pytest

from conftest import run
from supervise import write_config

@pytest.fixture
def nvml(bin_dir):
    """An environment in which dflash-launch finds the stub NVML with two H200s (GPU 1 exclusive)."""
    lib = bin_dir.parent / "testlib" / "libnvidia-ml.so.1"
    if not lib.exists():
        pytest.fail(f"{lib} is not built: ninja -C build nvml_stub")
    gpus = ("NVIDIA H200|150754820096|0|GPU-0a0a0a0a-0000-4000-8000-000000000000|9.0;"
            "NVIDIA H200|150754820096|3|GPU-1b1b1b1b-0000-4000-8000-000000000001|9.0")
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")}
    env.update(LD_LIBRARY_PATH=str(lib.parent), DFLASH_FAKE_NVML=gpus)
    return env


def gpu_role(devices, extra=""):
    return f"""
        [[role]]
        name = "d"
        devices = {devices}
        command = ["sh", "-c", "echo \\"$CUDA_VISIBLE_DEVICES $CUDA_DEVICE_ORDER\\" > $PWD/out-$ROLE_RANK.txt"]
        {extra}
        """


def test_check_names_each_gpu_and_refuses_one_past_the_count(bin_dir, tmp_path, nvml):
    cfg = write_config(tmp_path, gpu_role("[0, 1]"))
    r = run([bin_dir / "dflash-launch", "check", cfg], env=nvml, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "NVIDIA H200, 140 GiB, sm 9.0, default" in r.stdout and "exclusive-process" in r.stdout
    assert "d:1" in r.stdout and "GPU 1 (cuda:0 inside): NVIDIA H200, 140 GiB, sm 9.0, exclusive-process" in r.stdout
    assert "NVML" not in r.stderr
    j = json.loads(run([bin_dir / "dflash-launch", "check", "--json", cfg], env=nvml).stdout)
    assert j["gpus"]["nvml"] is True and [g["compute_mode"] for g in j["gpus"]["devices"]] == ["default",
                                                                                               "exclusive-process"]
    assert j["processes"][1]["gpu_model"]["uuid"] == "GPU-1b1b1b1b-0000-4000-8000-000000000001"
    assert j["processes"][0]["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_an_index_past_the_gpu_count_is_refused_before_anything_starts(bin_dir, tmp_path, nvml):
    cfg = write_config(tmp_path, gpu_role("[1, 2]"))
    for cmd in ("check", "run"):
        r = run([bin_dir / "dflash-launch", cmd, cfg, *(["--run-id", "past"] if cmd == "run" else [])], env=nvml,
                cwd=tmp_path)
        assert r.returncode == 2, (cmd, r.stdout, r.stderr)
        assert "d.devices[1] = 2, but this host has 2 GPUs (indices 0..1) (NVML)" in r.stderr, r.stderr
    assert not (tmp_path / "runs" / "past").exists() and not list(tmp_path.glob("out-*.txt"))


def test_without_nvml_it_is_said_once_and_nothing_is_refused(bin_dir, tmp_path, nvml):
    env = dict(nvml)
    del env["LD_LIBRARY_PATH"]  # this host has no driver: the real libnvidia-ml.so.1 is not there
    cfg = write_config(tmp_path, gpu_role("[7]"))
    r = run([bin_dir / "dflash-launch", "check", cfg], env=env)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("NVML: libnvidia-ml.so.1 not found") == 1, r.stderr
    assert "not checked: NVML" in r.stdout
    # The stub without its GPU list fails nvmlInit like a host whose driver is not loaded.
    env = dict(nvml)
    del env["DFLASH_FAKE_NVML"]
    r = run([bin_dir / "dflash-launch", "check", cfg], env=env)
    assert r.returncode == 0 and "nvmlInit failed" in r.stderr, r.stderr


def test_inherited_visible_devices_are_indexed_not_overwritten(bin_dir, tmp_path, nvml):
    """Slurm's gres gives the job GPUs 3 and 5: devices = [0, 1] are those two, in PCI bus order."""
    cfg = write_config(tmp_path, gpu_role("[0, 1]", 'cwd = "."'))
    env = dict(nvml, CUDA_VISIBLE_DEVICES="3,5")
    del env["LD_LIBRARY_PATH"]  # a 6-GPU host is not what the stub has; the count is not the point here
    r = run([bin_dir / "dflash-launch", "run", cfg, "--run-id", "gres"], env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out-0.txt").read_text() == "3 PCI_BUS_ID\n"
    assert (tmp_path / "out-1.txt").read_text() == "5 PCI_BUS_ID\n"
    r = run([bin_dir / "dflash-launch", "check", cfg], env=env)
    assert "devices index into the launcher's CUDA_VISIBLE_DEVICES=3,5" in r.stdout
    assert "GPU 1 = 5 of the launcher's CUDA_VISIBLE_DEVICES" in r.stdout
    cfg = write_config(tmp_path, gpu_role("[0, 2]"))
    r = run([bin_dir / "dflash-launch", "run", cfg, "--run-id", "gres2"], env=env, cwd=tmp_path)
    assert r.returncode == 2 and "leaves 2 GPUs" in r.stderr, r.stderr
    assert not (tmp_path / "runs" / "gres2").exists()


def test_leader_gets_the_hosts_compile_threads_followers_one(bin_dir, tmp_path):
    """Two gated processes, one key: the one that leads compiles with the host's share of workers."""
    script = ('echo "$DFLASH_GATE_ROLE $TORCHINDUCTOR_COMPILE_THREADS" > $PWD/threads-$ROLE_RANK.txt; '
              'd=$TORCHINDUCTOR_CACHE_DIR/fxgraph/ab/fab$$; mkdir -p $d && echo x > $d/e')
    cfg = write_config(tmp_path, f"""
        [[role]]
        name = "d"
        cpu = 2
        command = {json.dumps(["sh", "-c", script])}
        gate = {{ key = "k", mode = "serial" }}
        ready = "exit"
        """)
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_COMPILE_THREADS"}
    r = run([bin_dir / "dflash-launch", "run", cfg, "--run-id", "threads"], env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    got = sorted((tmp_path / f"threads-{i}.txt").read_text().split() for i in range(2))
    share = min(32, len(os.sched_getaffinity(0)))  # one key: the whole host
    assert got == sorted([["lead", str(share)], ["reuse", "1"]]), got
