"""The README's "Using it" commands work as written in a checkout after `make demo`: `. scripts/env` makes
`python` the .venv's (torch) and `dflash-launch` build/bin's, even when another `python` without torch comes
first on the PATH (the bug: the demo config's `python` was the system one, so seed --verify had no torch)."""
import json
import os
import stat

import torch

from conftest import ROOT, run


def test_readme_says_how_to_get_the_right_python():
    readme = (ROOT / "README.md").read_text()
    using = readme[readme.index("## Using it"):readme.index("## Where things are")]
    assert ". scripts/env" in using and "dflash-launch seed configs/demo.toml --verify" in using


def test_scripts_env_puts_the_venv_python_and_the_tools_first(bin_dir, tmp_path):
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    (decoy / "python").write_text("#!/bin/sh\necho decoy python without torch >&2; exit 3\n")
    (decoy / "python").chmod(stat.S_IRWXU)
    env = dict(os.environ, PATH=f"{decoy}:/usr/bin:/bin")
    env.pop("PYTHONPATH", None)
    script = (f"cd {tmp_path} && . {ROOT}/scripts/env && command -v python && command -v dflash-launch && "
              f"dflash-launch check --json {ROOT}/configs/demo.toml")
    r = run(["bash", "-c", script], env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    python, launcher, plan = r.stdout.split("\n", 2)
    assert python == str(ROOT / ".venv" / "bin" / "python")
    assert launcher == str(ROOT / "build" / "bin" / "dflash-launch")
    drafter = next(role for role in json.loads(plan)["roles"] if role["name"] == "drafter")
    assert drafter["command"][0] == "python"
    assert drafter["torch_version"] == torch.__version__  # the venv's python answered, not the decoy ("none")


def test_scripts_env_without_a_build_says_what_to_do(tmp_path):
    fake = tmp_path / "checkout"
    (fake / "scripts").mkdir(parents=True)
    (fake / "scripts" / "env").write_text((ROOT / "scripts" / "env").read_text())
    r = run(["bash", "-c", f". {fake}/scripts/env; echo PATH=$PATH"], env=dict(os.environ, PATH="/usr/bin:/bin"))
    assert "run `make build`" in r.stderr
    assert r.stdout.strip() == "PATH=/usr/bin:/bin"  # nothing half-set
