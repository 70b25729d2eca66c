"""The Python package's rooms and who ends a process (issue #48, items 2 and 3).

`import dflash_launch` imports no torch and leaves the process as it found it (no import hook, no excepthook)
outside a gated process; the classes users build are importable from the top. Library code raises; an uncaught
exception that carries an `exit_code` ends the process with it only where the process opted in
(dflash_launch.use_exit_codes(), which the spool's from_env() calls). The configs' old `python -m` names still
run their role. Each case runs in a fresh interpreter with this checkout's python/ first on sys.path."""
import os
import shutil
import subprocess
import sys
import textwrap

from conftest import ROOT

PKG = ROOT / "python" / "dflash_launch"
NO_GATE = {k: v for k, v in os.environ.items()
           if not k.startswith(("DFLASH_", "TORCHINDUCTOR_")) and k != "NOTIFY_SOCKET"}


def python(code, env=None, args=()):
    env = dict(NO_GATE if env is None else env, PYTHONPATH=str(ROOT / "python"))
    return subprocess.run([sys.executable, *args, "-c", textwrap.dedent(code)] if code is not None
                          else [sys.executable, *args], capture_output=True, text=True, env=env, timeout=120)


def test_import_dflash_launch_imports_no_torch_and_touches_nothing():
    r = python("""
        import sys
        hooks, meta = sys.excepthook, list(sys.meta_path)
        import dflash_launch
        import dflash_launch.spool, dflash_launch.checkpoint, dflash_launch.train_metrics, dflash_launch.token_chain
        assert "torch" not in sys.modules, sorted(m for m in sys.modules if m.startswith("torch"))
        assert sys.excepthook is hooks and sys.meta_path == meta, (sys.excepthook, sys.meta_path)
        from dflash_launch.spool import _native
        assert _native._lib is None and "libdflash_spool" not in open("/proc/self/maps").read()  # at first use
        print("clean")
    """)
    assert r.returncode == 0 and r.stdout == "clean\n", r.stderr


def test_the_spool_package_moves_no_file_itself_and_says_where_its_library_was_not(tmp_path):
    """Issue #56: every state move of a frame is libdflash_spool.so's; the Python package renames, links, unlinks
    and exchanges nothing (no os.rename/replace/link/unlink, no renameat2 of its own). Without the library a spool
    class says each place it looked and the fix."""
    import re
    moves = re.compile(r"\bos\.(rename|replace|link|unlink|remove|symlink)\(|renameat2|shutil\.(move|rmtree)")
    found = [f"{p.name}:{i}: {line.strip()}" for p in sorted((ROOT / "python" / "dflash_launch" / "spool").glob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if moves.search(line)]
    assert found == [], found
    shutil.copytree(ROOT / "python" / "dflash_launch", tmp_path / "pkg" / "dflash_launch")  # no build/ above it
    code = ("from dflash_launch.spool import SpoolSource, SpoolError\ntry:\n    SpoolSource('/tmp/nowhere', 'd:0', {}, 1)\n"
            "except SpoolError as e:\n    print(e)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(NO_GATE, PYTHONPATH=str(tmp_path / "pkg"), DFLASH_SPOOL_LIB="/nonexistent/lib.so"))
    tried = ["/nonexistent/lib.so (absent)", f"{tmp_path}/pkg/dflash_launch/lib/libdflash_spool.so (absent)"]
    assert all(t in r.stdout for t in tried) and "make build" in r.stdout, (r.stdout, r.stderr)


def test_a_library_that_is_not_the_spools_is_a_place_tried_not_a_crash(tmp_path):
    """DFLASH_SPOOL_LIB naming another library (here libc), as an older build lacking a call would be: the spool
    class says what that library lacks among the places it tried, as a SpoolError, never an AttributeError."""
    libc = next(line.split()[-1] for line in open("/proc/self/maps") if "/libc.so" in line or "/libc-" in line)
    shutil.copytree(ROOT / "python" / "dflash_launch", tmp_path / "pkg" / "dflash_launch")  # no build/ above it
    code = ("from dflash_launch.spool import SpoolSource, SpoolError\ntry:\n    SpoolSource('/tmp/nowhere', 'd:0', {}, 1)\n"
            "except SpoolError as e:\n    print(e)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(NO_GATE, PYTHONPATH=str(tmp_path / "pkg"), DFLASH_SPOOL_LIB=libc))
    assert r.returncode == 0 and f"{libc} (has no dfs_abi_version: not this package's" in r.stdout, (r.stdout, r.stderr)


def test_even_in_a_gated_process_the_import_patches_nothing_and_share_isa_probe_hooks_once(tmp_path):
    """A gated process (DFLASH_GATE_ROLE, the gate's .dflash/ in the cache dir): `import dflash_launch` still
    leaves sys.meta_path as it was; share_isa_probe() adds the one hook, once, however often it is called; with
    DFLASH_ISA_SHARE=0 it adds none."""
    cache = tmp_path / "cache"
    (cache / ".dflash").mkdir(parents=True, mode=0o700)
    code = """
        import sys
        meta = list(sys.meta_path)
        import dflash_launch
        assert sys.meta_path == meta, sys.meta_path
        print(dflash_launch.share_isa_probe(), dflash_launch.share_isa_probe(), len(sys.meta_path) - len(meta))
    """
    gated = dict(NO_GATE, DFLASH_GATE_ROLE="lead", TORCHINDUCTOR_CACHE_DIR=str(cache))
    r = python(code, env=gated)
    assert r.returncode == 0 and r.stdout == "True True 1\n", (r.stdout, r.stderr)
    r = python(code, env=dict(gated, DFLASH_ISA_SHARE="0"))
    assert r.returncode == 0 and r.stdout == "False False 0\n", (r.stdout, r.stderr)
    r = python(code, env=NO_GATE)  # not gated
    assert r.returncode == 0 and r.stdout == "False False 0\n", (r.stdout, r.stderr)


def test_the_public_api_is_importable_from_the_top():
    r = python("""
        import sys
        import dflash_launch
        from dflash_launch import (Checkpoint, FrameContractError, SpoolError, SpoolProducer, SpoolSource,
                                   TrainingMetrics, WorldSource, use_exit_codes)
        import dflash_launch.spool as spool
        assert SpoolSource is spool.SpoolSource and WorldSource is spool.WorldSource
        assert FrameContractError.__module__ == "dflash_launch.spool"
        assert "torch" not in sys.modules
        try:
            dflash_launch.NoSuchThing
        except AttributeError as e:
            assert "NoSuchThing" in str(e)
        else:
            raise AssertionError("no AttributeError")
        print(sorted(set(dflash_launch.__all__) - set(dir(dflash_launch)) - set(dflash_launch._LAZY)))
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "[]\n", r.stdout  # every name in __all__ exists


def test_every_module_lives_in_its_room():
    """One row a room in docs/design.md: the top is the user API and the wheel's glue; the rest in subpackages."""
    top = sorted(p.name for p in PKG.glob("*.py"))
    # and the old names of the modules that moved, each a shim for a release (dflash_launch/_moved.py, issue #59)
    shims = [f.name for f in PKG.glob("*.py") if "moved_to(__name__" in f.read_text()]
    assert {"hf_target.py", "reference_drafter.py", "spool_world.py"} <= set(shims), shims
    assert sorted(set(top) - set(shims)) == [
        "__init__.py", "_bin.py", "_extras.py", "_moved.py", "checkpoint.py", "checkpoint_identity.py", "ddp_buckets.py",
        "exit_codes.py", "stateful.py", "token_chain.py", "train_metrics.py"], top
    rooms = sorted(p.name for p in PKG.iterdir() if p.is_dir() and p.name != "__pycache__" and p.name != "bin"
                   and p.name not in ("configs", "examples"))
    assert rooms == ["inductor", "roles", "spool", "tools"], rooms
    assert set(PKG.glob("spool_*.py")) <= {PKG / s for s in shims}, "the spool's modules live in dflash_launch/spool/"
    design = (ROOT / "docs" / "design.md").read_text()
    for room in ["dflash_launch/spool/", "dflash_launch/roles/", "dflash_launch/tools/", "dflash_launch/inductor/"]:
        assert f"`python/{room}`" in design, room


CONTRACT_ERROR = """
    import sys
    from dflash_launch.spool.format import FrameContractError
    {opt_in}
    raise FrameContractError("f.safetensors", "t:0", "taps stacked", "[1, 2, 6]", "[1, 2, 3, 2]", "cat them")
"""


def test_a_contract_error_exits_65_only_where_the_process_opted_in():
    r = python(CONTRACT_ERROR.format(opt_in="import dflash_launch; dflash_launch.use_exit_codes()"))
    assert r.returncode == 65, (r.returncode, r.stderr)
    assert r.stderr.count("Traceback") == 1 and "frame f.safetensors from producer t:0" in r.stderr, r.stderr
    r = python(CONTRACT_ERROR.format(opt_in=""))  # a library user: Python's own 1, the hook untouched
    assert r.returncode == 1 and "FrameContractError" in r.stderr, (r.returncode, r.stderr)


def test_a_hook_installed_later_that_holds_stderr_still_prints_the_traceback_and_exits_65():
    """torch.distributed.init_process_group wraps sys.excepthook and captures stderr until the wrapped hook returns
    (to prefix the rank). An exit inside our hook lost the traceback (the quarantine test's world saw exit 65 and
    an empty stderr); the exit waits for the outer hook."""
    r = python(CONTRACT_ERROR.format(opt_in='''import dflash_launch, io; dflash_launch.use_exit_codes()
    inner = sys.excepthook
    def outer(*args):  # what torch.distributed's _distributed_excepthook does
        real, sys.stderr = sys.stderr, io.StringIO()
        try:
            inner(*args)
        finally:
            held, sys.stderr = sys.stderr.getvalue(), real
        sys.stderr.write("".join(f"[rank0]: {line}\\n" for line in held.splitlines()))
    sys.excepthook = outer'''))
    assert r.returncode == 65, (r.returncode, r.stderr)
    assert "[rank0]: Traceback" in r.stderr and "[rank0]: dflash_launch.spool.FrameContractError: frame f.safetensors" \
        in r.stderr, r.stderr


def test_from_env_opts_a_payload_in_and_a_hand_built_source_does_not(tmp_path):
    env = dict(NO_GATE, DFLASH_SPOOL_DIR=str(tmp_path / "spool"), DFLASH_SPOOL_PRODUCERS="1",
               DFLASH_RUN_DIR=str(tmp_path), DFLASH_PROCESS="drafter:0")
    contract = ("dict(hidden_shape=[1, 32, 96], tapped_layers=[1, 2, 3], hidden=32, batch=1, seq_len=32, "
                "dtype='fp32', vocab=64, target_layers=4)")
    r = python(f"""
        import sys
        from dflash_launch.spool import SpoolSource
        before = sys.excepthook
        SpoolSource("{tmp_path}/by-hand", "d:0", {contract}, producers=1)
        assert sys.excepthook is before
        SpoolSource.from_env({contract})
        assert sys.excepthook is not before and sys.excepthook.dflash_exit_codes
        print("ok")
    """, env=env)
    assert r.returncode == 0 and r.stdout == "ok\n", r.stderr


def test_a_spent_warmup_raises_and_an_opted_in_process_ends_with_0_quietly():
    r = python("""
        import dflash_launch
        from dflash_launch.spool.warmup import WarmupSpent, warmup_spent
        try:
            warmup_spent("drafter:0", 2, "synthetic frames")
        except WarmupSpent as e:
            assert e.exit_code == 0
        dflash_launch.use_exit_codes()
        warmup_spent("drafter:0", 2, "synthetic frames")
        print("not reached")
    """)
    assert r.returncode == 0 and "not reached" not in r.stdout, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and r.stderr.count("warm-up stopped after 2 synthetic frames") == 2, r.stderr


def test_no_library_module_exits():
    """Only entry points end a process: main() of the roles and tools, the wheel's console scripts, and the one
    excepthook of exit_codes.py. A library module that calls sys.exit, os._exit or raises SystemExit fails here."""
    entry_points = {"_bin.py", "exit_codes.py", "roles/hf_target.py", "roles/reference_drafter.py",
                    "tools/demo_report.py", "tools/gpu_check.py", "tools/starter.py"}
    import ast
    for f in sorted(PKG.rglob("*.py")):
        rel = str(f.relative_to(PKG))
        for node in ast.walk(ast.parse(f.read_text())):
            exits = (isinstance(node, ast.Attribute) and node.attr in ("exit", "_exit", "excepthook")
                     and getattr(node.value, "id", None) in ("sys", "os")) or \
                    (isinstance(node, ast.Name) and node.id == "SystemExit")
            if not exits:
                continue
            assert rel in entry_points, f"{rel}:{node.lineno}: a library module ends the process"


def test_the_configs_old_module_names_still_run_their_role():
    """run.toml files written before the move name `python -m dflash_launch.hf_target` / `.reference_drafter`:
    they run the role (here its own refusal outside dflash-launch) after a line naming the new module."""
    for role in ("hf_target", "reference_drafter"):
        r = python(None, args=("-m", f"dflash_launch.{role}", "--help"))
        assert r.returncode == 0, r.stderr
        assert f"dflash_launch.{role} moved to dflash_launch.roles.{role}" in r.stderr
        assert "usage:" in r.stdout, r.stdout
