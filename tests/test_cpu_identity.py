"""Identity on what a process shares (issue #55, items 1 and 4): a compiled entry is loaded only by a process of the
CPU and vector ISA it was compiled for, and a gated payload that runs with Dynamo's precompile cache, or with another
ATEN_CPU_CAPABILITY than its gate's, is refused where it takes effect (its own environment, its own torch), not only
in the config's env tables.

torch 2.13's FX-graph key on CPU does not cover the vector ISA Inductor picks: on this AVX2 host an entry compiled by
a process that picks AVX2 was a hit for the same run's process with ATEN_CPU_CAPABILITY=default (no vector ISA), and
that process failed to build the kernels it loaded (`at::vec has not been declared`); on an AVX-512 host the other
way round it computed wrong values (the issue's 265.9 for -82.6). ATEN_CPU_CAPABILITY on one host stands in for a
second CPU."""
import json
import subprocess
import sys

import pytest

from conftest import ROOT
from supervise import write_config

pytest.importorskip("torch")

PY = sys.executable
PAYLOADS = ROOT / "tests" / "payloads"
ENV_LINE = 'TORCHINDUCTOR_COMPILE_THREADS = "1", OMP_NUM_THREADS = "1"'


def isa_role(name, after=None, capability=None):
    env = ENV_LINE + (f', ATEN_CPU_CAPABILITY = "{capability}"' if capability is not None else "")
    return f"""
[[role]]
name = "{name}"
cpu = 1
command = ["{PY}", "{PAYLOADS / 'isa_step.py'}"]
env = {{ {env} }}
gate = {{ key = "shared", mode = "serial", timeout = "10m" }}
ready = {{ mode = "notify", timeout = "10m" }}
{f'after = ["{after}"]' if after else ''}
"""


def test_an_entry_compiled_for_another_isa_is_never_loaded(launch, tmp_path):
    """One run, one cache dir, one explicit gate key (nothing in the key tells the roles apart): `vec` compiles with
    this host's vector ISA; then `scalar` (ATEN_CPU_CAPABILITY=default, as on a CPU without one) must not load its
    entry: it leads (vec's READY is another CPU's), compiles for itself and computes eager's values; then `vec2`, of
    vec's CPU, loads vec's entry."""
    cfg = write_config(tmp_path, isa_role("vec") + isa_role("scalar", "vec", "default") + isa_role("vec2", "scalar"))
    r = launch(cfg)
    assert r.wait(timeout=900) == 0, r.out[-4000:] + r.err[-3000:]
    by_role = {p["name"].split(":")[0]: p for p in r.summary()["processes"]}
    vec, scalar, vec2 = (by_role[n]["metrics"] for n in ("vec", "scalar", "vec2"))
    if vec["isa"] == "INVALID_VEC_ISA":
        pytest.skip("this CPU has no vector ISA Inductor uses: nothing to tell apart")
    assert scalar["isa"] == "INVALID_VEC_ISA", scalar
    for name, m in (("vec", vec), ("scalar", scalar), ("vec2", vec2)):
        assert m["equal"], (name, m, "compiled != eager")
        assert m["tag"].startswith("dflash-cpu-"), (name, m)
    assert vec["tag"] == vec2["tag"] != scalar["tag"]
    assert vec["fxgraph_cache_miss"] >= 1, vec
    assert scalar["fxgraph_cache_hit"] == 0 and scalar["fxgraph_cache_miss"] >= 1, scalar  # compiled its own
    assert vec2["fxgraph_cache_hit"] >= 1 and vec2["fxgraph_cache_miss"] == 0, vec2  # the same CPU still shares
    assert [by_role[n]["gate"]["role"] for n in ("vec", "scalar", "vec2")] == ["lead", "lead", "lead"]
    ready = json.loads((tmp_path / "cache" / ".dflash" / "ready" / "shared.json").read_text())
    assert "ATEN_CPU_CAPABILITY unset" in ready["cpu"], ready  # vec2's, made for its CPU


def test_the_cpu_is_in_the_derived_key_and_every_processs_tag(bin_dir, tmp_path):
    """`check --json`: two configs that differ only in a role's ATEN_CPU_CAPABILITY get two gate keys, two CPU
    identities and two tags; a tag of the user's own is kept beside ours."""
    def plan(extra):
        d = tmp_path / (extra.split("=")[0].strip() or "plain")
        d.mkdir()
        cfg = write_config(d, f"""
[[role]]
name = "d"
cpu = 1
command = ["{PY}", "{PAYLOADS / 'isa_step.py'}"]
env = {{ {ENV_LINE}{', ' + extra if extra else ''} }}
gate = true
""")
        out = subprocess.run([str(bin_dir / "dflash-launch"), "check", "--json", str(cfg)], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["roles"][0]
    plain, avx2, own = plan(""), plan('ATEN_CPU_CAPABILITY = "default"'), plan('TORCH_COMPILE_CACHE_KEY_TAG = "exp7"')
    assert plain["gate"]["key"] != avx2["gate"]["key"]
    assert "ATEN_CPU_CAPABILITY unset" in plain["cpu_identity"] and "ATEN_CPU_CAPABILITY default" in avx2["cpu_identity"]
    assert plain["cache_key_tag"] != avx2["cache_key_tag"]
    assert own["cache_key_tag"] == "exp7," + plain["cache_key_tag"]


WRAPPED = {
    "env": ["env", "TORCH_CACHING_PRECOMPILE=1", PY, "{script}", "wrapper"],
    "shell": ["sh", "-c", "TORCH_CACHING_PRECOMPILE=1 " + PY + " {script} wrapper; true"],
    "script": [PY, "{script}", "script"],
    "isa": ["env", "ATEN_CPU_CAPABILITY=default", PY, "{script}", "wrapper"],
    "script_isa": [PY, "{script}", "script_isa"],
}


@pytest.mark.parametrize("how", sorted(WRAPPED))
def test_a_payload_that_changes_what_it_compiles_with_is_refused(launch, tmp_path, how):
    """The config's env tables are clean, so `check` and the plan pass; the payload's own process turns on Dynamo's
    precompile cache (a wrapper, a shell line, the script itself) or picks another vector ISA (a wrapper, or the
    script's os.environ before torch reads it). dflash-worker finds it
    (the process tree's environ; the torch config the payload reports with READY), kills the payload before it runs
    on, publishes no READY, and the process ends 2 with the reason."""
    command = [a.replace("{script}", str(PAYLOADS / "precompile_on.py")) for a in WRAPPED[how]]
    cfg = write_config(tmp_path, f"""
[[role]]
name = "d"
cpu = 1
command = {json.dumps(command)}
gate = {{ key = "pc", mode = "serial" }}
ready = {{ mode = "notify", timeout = "5m" }}
""")
    r = launch(cfg)
    assert r.wait(timeout=300) == 2, r.out[-3000:] + r.err[-3000:]  # the payload sleeps 600 s: it was killed
    (p,) = r.summary()["processes"]
    assert p["exit_code"] == 2, p
    want = "ATEN_CPU_CAPABILITY" if how in ("isa", "script_isa") else "precompile"
    assert want in json.dumps(p), p
    assert not (tmp_path / "cache" / ".dflash" / "ready" / "pc.json").exists()
