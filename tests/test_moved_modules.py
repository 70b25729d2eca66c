"""Stable imports (issue #59 item 6): every module of dflash_launch that moved keeps its old name for a release, a
shim that is the new module and says so (DeprecationWarning at the importer's line); and `check` names an import of
a role's script that the role's Python cannot find, with its file:line, before a run fails on it."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT, run
from supervise import write_config

sys.path.insert(0, str(ROOT / "python"))
from dflash_launch._moved import MOVED  # noqa: E402

PY = sys.executable
ENV = dict(os.environ, PYTHONPATH=str(ROOT / "python"))


def renamed_modules():
    """{old module: new module} for every .py that git's history renamed in python/dflash_launch."""
    r = run(["git", "-C", ROOT, "log", "--diff-filter=R", "--name-status", "--format=", "--", "python/dflash_launch"])
    if r.returncode != 0:
        pytest.skip("not a git checkout")

    def module(path):
        name = path[len("python/"):-len(".py")].replace("/", ".")
        return name[:-len(".__init__")] if name.endswith(".__init__") else name

    out = {}
    for line in r.stdout.splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[0].startswith("R") and parts[1].endswith(".py") and parts[2].endswith(".py"):
            out[module(parts[1])] = module(parts[2])
    return out


def test_every_module_that_moved_keeps_its_old_name():
    renamed = renamed_modules()
    assert renamed["dflash_launch.spool_world"] == "dflash_launch.spool.world", renamed  # the one that broke a script
    for old, new in renamed.items():
        if old == new:  # spool.py -> spool/__init__.py: the same name
            continue
        assert MOVED.get(old) == new, f"{old} moved to {new} without a shim: add it to dflash_launch/_moved.py"
        shim = ROOT / "python" / (old.replace(".", "/") + ".py")
        assert shim.is_file() and "moved_to(__name__" in shim.read_text(), shim


def test_each_old_name_warns_at_the_importers_line_and_is_the_new_module(tmp_path):
    script = tmp_path / "old_names.py"
    script.write_text(textwrap.dedent(f"""\
        import importlib, sys, warnings
        moved = {MOVED!r}
        for old, new in moved.items():
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                __import__(old)  # as an import statement does (import_module would be the importer)
                module = sys.modules[old]
            said = [x for x in w if issubclass(x.category, DeprecationWarning) and old in str(x.message)]
            assert len(said) == 1, (old, [str(x.message) for x in w])
            assert str(said[0].message).startswith(old + " moved to " + new + ":"), str(said[0].message)
            assert said[0].filename == __file__, (old, said[0].filename)  # the importer's line, not the shim's
            assert module is importlib.import_module(new) is sys.modules[old], old
        print("checked", len(moved))
        """))
    r = run([PY, script], env=ENV, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == f"checked {len(MOVED)}", r.stdout + r.stderr


def test_a_week_old_script_runs_and_is_told_the_new_name(tmp_path):
    """What broke (issue #59): a script importing dflash_launch.spool_world. Python shows the warning by default
    (the import is in __main__), at the script's own line."""
    script = tmp_path / "old_train.py"
    script.write_text("from dflash_launch.spool_world import WorldSource\n"
                      "import dflash_launch.spool_world as sw\n"
                      "from dflash_launch import WorldSource as new\n"
                      "assert WorldSource is new and sw.WorldSource is new\n"
                      "print(WorldSource.__module__)\n")
    r = run([PY, script], env=ENV, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "dflash_launch.spool.world\n", r.stdout
    assert f"{script}:1: DeprecationWarning: dflash_launch.spool_world moved to dflash_launch.spool.world" \
        in r.stderr, r.stderr
    assert r.stderr.count("DeprecationWarning") == 1, r.stderr  # once: the second import is the module itself


def test_check_names_an_import_the_scripts_python_cannot_find(bin_dir, tmp_path):
    (tmp_path / "model_code.py").write_text("X = 1\n")  # a sibling of the script: found, as python will
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        import os
        import model_code
        from dflash_launch.spool_world import WorldSource
        import no_such_module_59
        from dflash_launch import no_such_part_59, notify_ready
        try:
            import optional_module_59
        except ImportError:
            optional_module_59 = None
        from os import path
        """))
    cfg = write_config(tmp_path, f"""
        [[role]]
        name = "drafter"
        cpu = 1
        command = {json.dumps([PY, "train.py"])}
        env = {{ PYTHONPATH = {json.dumps(str(ROOT / "python"))} }}
        """)
    r = run([bin_dir / "dflash-launch", "check", cfg], cwd=tmp_path)
    assert r.returncode == 0, r.stderr  # a warning: the plan is valid, and the script may add its own path
    said = [l for l in r.stderr.splitlines() if ": warning: role[drafter]: imports " in l]
    assert said == [
        f"{script}:4: warning: role[drafter]: imports no_such_module_59, which {PY} cannot find (from the role's "
        "cwd, with its PYTHONPATH): the process would stop there",
        f"{script}:5: warning: role[drafter]: imports dflash_launch.no_such_part_59, which {PY} cannot find (from "
        "the role's cwd, with its PYTHONPATH): the process would stop there",
    ], r.stderr  # not model_code (beside the script), not the moved name (its shim), not the guarded import
    assert "hint: install it into that python's environment, add its folder to the role's env PYTHONPATH" in r.stderr
    assert "hint: this dflash_launch has no module dflash_launch.no_such_part_59" in r.stderr
    # What python itself says when it runs it: the same module, the same line.
    p = subprocess.run([PY, script], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "No module named 'no_such_module_59'" in p.stderr and 'line 4' in p.stderr, p.stderr
