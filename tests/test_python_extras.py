"""The Python package's dependencies, declared honestly: the core is standard library only, the rest comes
with the `[torch]` and `[demo]` extras, and a missing extra is an error that names it (issue #14).

Each case runs in a fresh interpreter where torch, safetensors, matplotlib and triton cannot be imported
(a sys.meta_path finder refuses them), with this checkout's python/ first on sys.path."""
import ast
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT

PKG = ROOT / "python" / "dflash_launch"
BLOCKED = ("torch", "safetensors", "matplotlib", "triton")

BLOCKER = f"""
import sys
class _NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the test)", name=name)
        return None
sys.meta_path.insert(0, _NotInstalled())
"""


def run_without_extras(code, env=None):
    env = dict(env) if env is not None else {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
    env["PYTHONPATH"] = str(ROOT / "python")
    return subprocess.run([sys.executable, "-c", BLOCKER + textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, timeout=60)


def test_the_blocker_blocks():
    r = run_without_extras("import torch")
    assert r.returncode != 0 and "blocked by the test" in r.stderr, r.stderr


def test_the_core_imports_and_works_without_any_extra(tmp_path):
    # notify, the role helpers and the spool's file protocol, for real: a READY=1 reaches a socket.
    path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.settimeout(60)
        r = run_without_extras("""
            import sys
            import dflash_launch, dflash_launch._bin, dflash_launch.tools.demo_report, dflash_launch.tools.gpu_check
            import dflash_launch.spool as spool
            assert dflash_launch.notify_ready("warm") is True
            assert dflash_launch.gate_role() == "" and dflash_launch.is_warmup() is False
            assert spool.parse_frame_file(spool.frame_file("target:0", 7))[1] == 7
            for name in sys.modules:
                assert name.split(".")[0] not in ("torch", "safetensors", "matplotlib"), name
            print("core ok")
        """, env=dict(os.environ, NOTIFY_SOCKET=path))
        assert r.returncode == 0, r.stderr
        assert r.stdout == "core ok\n"
        assert sorted(sock.recv(4096).split(b"\n")) == [b"READY=1", b"STATUS=warm"]  # one datagram: order is free


@pytest.mark.parametrize("extra,code", [
    ("torch", "import dflash_launch; dflash_launch.check_hidden_states(None, n_taps=5, hidden=64)"),
    ("torch", "import dflash_launch; dflash_launch.init_process_group()"),
    ("torch", "import dflash_launch.roles.reference_drafter"),
    ("torch", "from dflash_launch.tools.gpu_check import torch_info; torch_info()"),
    ("torch", "from dflash_launch.spool import frame_bytes; frame_bytes(None, None, {})"),
    ("demo", "from dflash_launch.tools.demo_report import plot; plot([], 'report.png', 'loss')"),
])
def test_a_missing_extra_is_an_import_error_that_names_it(extra, code):
    r = run_without_extras(f"""
        from dflash_launch import MissingExtraError
        try:
            {code}
        except MissingExtraError as e:
            assert isinstance(e, ImportError)
            print(e)
        else:
            raise SystemExit("no MissingExtraError")
    """)
    assert r.returncode == 0, r.stderr
    assert f"pip install 'dflash-launch[{extra}]'" in r.stdout, r.stdout
    assert "blocked by the test" in r.stdout  # and why: the import error underneath


def third_party_imports():
    """Top-level modules outside the standard library that the package imports (an import statement, or
    `require("module", ...)`), by file."""
    found = {}
    for f in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "require" and node.args
                  and isinstance(node.args[0], ast.Constant)):
                names = [node.args[0].value]
            for n in names:
                top = n.split(".")[0]
                if top not in sys.stdlib_module_names and top != "dflash_launch":
                    found.setdefault(top, set()).add(str(f.relative_to(PKG)))
    return found


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib and sys.stdlib_module_names: Python 3.11")
def test_every_third_party_import_is_in_a_declared_extra():
    import tomllib
    sys.path.insert(0, str(ROOT / "python"))
    try:
        from dflash_launch._extras import EXTRA_OF
    finally:
        sys.path.pop(0)
    # triton is probed by the GPU check and optional there (ImportError -> null in its report).
    imported = set(third_party_imports()) - {"triton"}
    assert imported == set(EXTRA_OF), third_party_imports()
    for pyproject in (ROOT / "pyproject.toml", ROOT / "python" / "pyproject.toml"):
        project = tomllib.loads(pyproject.read_text())["project"]
        assert project["dependencies"] == [], pyproject
        extras = project["optional-dependencies"]
        for module, extra in EXTRA_OF.items():
            assert module in extras[extra], (pyproject, extra, module)
        # [demo] is a superset of [torch]: the demo runs the drafter.
        assert set(extras["torch"]) <= set(extras["demo"]), pyproject
