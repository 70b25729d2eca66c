"""Under a real Slurm: a two-node cluster on this host (Debian's slurmctld and two
slurmd, a private munged), srun places one dflash-launch per node, and the ranks
come out right; a failure on one node ends the other through srun
--kill-on-bad-exit (the static mode of docs/multinode.md). Skipped without root
or the packages (scripts/setup installs them)."""
import json
import os
import pathlib
import shutil
import socket
import subprocess

import pytest

from conftest import ROOT
from supervise import alive_with_marker, wait_until, write_config

PY = ROOT / ".venv" / "bin" / "python"
GLOO = ROOT / "tests" / "payloads" / "gloo_world.py"
DAEMONS = ["munged", "slurmctld", "slurmd", "srun", "sinfo", "scontrol"]


def free_ports(n):
    """n consecutive ports nobody listens on (slurm.conf wants a node port range)."""
    for _ in range(100):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        base = s.getsockname()[1]
        s.close()
        if base + n > 65535:
            continue
        ok = True
        for p in range(base, base + n):
            t = socket.socket()
            try:
                t.bind(("127.0.0.1", p))
            except OSError:
                ok = False
            finally:
                t.close()
        if ok:
            return base
    raise RuntimeError("no free port range")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("a private Slurm cluster needs root here (SlurmUser=root)")
    missing = [d for d in DAEMONS if not shutil.which(d) and not os.path.exists(f"/usr/sbin/{d}")]
    if missing:
        pytest.skip(f"not installed: {missing} (scripts/setup installs slurmctld slurmd slurm-client munge)")
    d = tmp_path_factory.mktemp("slurm")
    for sub in ("munge", "state", "spool", "log"):
        (d / sub).mkdir()
    (d / "munge").chmod(0o711)  # munged wants others to reach its socket
    key = d / "munge" / "key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    sock = d / "munge" / "sock"
    ctld, node = free_ports(1), free_ports(3)
    host = socket.gethostname()
    conf = d / "slurm.conf"
    conf.write_text(f"""\
ClusterName=dflashtest
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmctldPort={ctld}
SlurmdPort={node + 2}
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
ReturnToService=2
MpiDefault=none
KillWait=5
NodeName=n[1-2] NodeHostname={host} NodeAddr=127.0.0.1 Port={node}-{node + 1} CPUs=2 State=UNKNOWN
PartitionName=p Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP
""")
    env = dict(os.environ, SLURM_CONF=str(conf))
    procs = []

    def daemon(*argv):
        out = open(d / "log" / f"{pathlib.Path(argv[0]).name}-{len(procs)}.out", "w")
        procs.append(subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, env=env))

    try:
        daemon("munged", "-F", "--force", f"--socket={sock}", f"--key-file={key}", f"--log-file={d}/munge/log",
               f"--pid-file={d}/munge/pid", f"--seed-file={d}/munge/seed")
        assert wait_until(sock.exists), "munged did not start"
        daemon("slurmctld", "-D", "-f", str(conf))
        for n in ("n1", "n2"):
            daemon("slurmd", "-D", "-f", str(conf), "-N", n)
        sinfo = []

        def both_idle():
            r = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, env=env)
            sinfo[:] = [r.stdout, r.stderr]
            states = dict(line.split() for line in r.stdout.splitlines() if line.strip())
            return states.get("n1") == "idle" and states.get("n2") == "idle"
        assert wait_until(both_idle, step=0.2), f"slurm nodes not idle: {sinfo}"
        yield env
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def srun(env, tmp_path, *args, timeout=180):
    return subprocess.run(["srun", "-N2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", *args],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=timeout)


def test_srun_places_one_launcher_per_node_and_the_ranks_come_out_right(slurm, bin_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    cmd = json.dumps([str(PY), str(GLOO), str(out)])
    config = write_config(tmp_path, f"""
        [[role]]
        name = "a"
        cpu = 2
        command = {cmd}

        [[role]]
        name = "b"
        cpu = 2
        command = {cmd}
        """)
    r = srun(slurm, tmp_path, str(bin_dir / "dflash-launch"), "run", str(config), "--color", "never")
    assert r.returncode == 0, r.stdout + r.stderr
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1 and runs[0].name.startswith("t-slurm-")  # one run id, from the job, on both nodes
    run_id = runs[0].name
    res = {d["rank"]: d for d in (json.loads(p.read_text()) for p in out.glob(f"{run_id}.*.json"))}
    assert sorted(res) == list(range(8))
    for rank, d in res.items():
        assert d["world"] == 8 and d["sum"] == 36.0 and d["node_rank"] == rank // 4
        assert d["role_world"] == 4 and d["role_peers"] == [run_id] * 4
    for node in (0, 1):
        summary = json.loads((runs[0] / f"node_{node}" / "summary.json").read_text())
        assert len(summary["processes"]) == 4


def test_a_failure_on_one_node_ends_the_other_through_srun(slurm, bin_dir, tmp_path):
    marker = f"slurm-static-{os.getpid()}"
    config = write_config(tmp_path, f"""
        [[role]]
        name = "w"
        cpu = 2
        command = ["sh", "-c", "[ $RANK = 3 ] && exit 7; exec sleep 600 # {marker}"]
        """)
    r = srun(slurm, tmp_path, str(bin_dir / "dflash-launch"), "run", str(config), "--color", "never")
    assert r.returncode != 0, r.stdout + r.stderr
    run_dir = next((tmp_path / "runs").iterdir())
    node1 = json.loads((run_dir / "node_1" / "summary.json").read_text())
    assert node1["exit_code"] == 7, node1
    # srun ended node 0's launcher, which stopped its sleepers: nothing is left running.
    assert wait_until(lambda: not alive_with_marker(marker)), alive_with_marker(marker)
