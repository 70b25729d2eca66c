"""`dflash-launch init NAME`: a starter run directory from the shipped examples, one that runs from the wheel.

NAME/run.toml is examples/ddp-spool/run.toml (your own DDP drafters on the spool) with its builtin LibTorch target
(a source build only: docs/wheel.md) replaced by the Python target `dflash_launch.roles.hf_target --random-qwen3` (a random
Qwen3 of the [model] shape, no download; needs torch and transformers in the venv: the `[hf]` extra), its run named
NAME and its cache and logs beside it; NAME/drafter.py is the example's drafter, unchanged. Nothing that exists is
overwritten: if either file is there, nothing is written and the exit status is 1.

The entry point handles `init` before it execs the bundled binary (dflash_launch/_bin.py); in a source checkout
`python -m dflash_launch.tools.starter NAME` does the same from the checkout's examples/."""
import argparse
import os
import re
import sys

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # dflash_launch/, above tools/
EXAMPLE = "ddp-spool"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
HF_TARGET = ('spool = "produce"                  # a Python target: a random Qwen3 of [model]; your own model: '
             '--model DIR --tokens FILE.jsonl\n'
             'command = ["python", "-m", "dflash_launch.roles.hf_target", "--random-qwen3"]')


class StarterError(Exception):
    pass


def data_dir(name):
    """configs/ or examples/: the wheel's package data, else the source checkout's (python/dflash_launch/../..)."""
    for d in (os.path.join(_PACKAGE, name), os.path.join(os.path.dirname(os.path.dirname(_PACKAGE)), name)):
        if os.path.isdir(d):
            return d
    raise StarterError(f"no {name}/ in {_PACKAGE} nor in a checkout above it: this dflash_launch is incomplete")


def _replace_once(text, pattern, repl, what):
    new, n = re.subn(pattern, lambda _m: repl, text, flags=re.M)
    if n != 1:  # the shipped example changed shape: say so rather than write a starter that is half the old one
        raise StarterError(f"examples/{EXAMPLE}/run.toml: expected one {what}, found {n}")
    return new


def starter_toml(name):
    src = os.path.join(data_dir("examples"), EXAMPLE, "run.toml")
    with open(src, encoding="utf-8") as f:
        text = f.read()
    body = text[text.index("\n[run]") + 1:]  # the example's header says how to run it from the checkout: not ours
    end = body.index("\n[", 1) + 1  # the [run] table: its keys only (the roles have a name too)
    run, rest = body[:end], body[end:]
    run = _replace_once(run, r'^name = ".*"$', f'name = "{name}"', "[run] name")
    run = _replace_once(run, r'^cache_dir = ".*"$', 'cache_dir = "cache"               # relative to this file',
                        "[run] cache_dir")
    run = _replace_once(run, r'^log_dir = ".*"$', 'log_dir = "runs"', "[run] log_dir")
    body = run + _replace_once(rest, r'^builtin = "target".*$', HF_TARGET, 'builtin = "target"')
    header = (f"# {name}: a starter from dflash-launch's examples/{EXAMPLE} (`dflash-launch init {name}`).\n"
              "# Two Python targets (a random Qwen3 of [model], no download) publish hidden states to the spool;\n"
              "# three ranks of drafter.py train on them as one DDP world behind the compile gate. Needs torch and\n"
              "# transformers in the venv that holds dflash-launch (pip install 'dflash-launch[hf]', or your torch\n"
              "# first: docs/wheel.md). Check it, then run it:\n"
              f"#   dflash-launch check {name}/run.toml && dflash-launch run {name}/run.toml\n"
              "# Every key: docs/config.md.\n\n")
    return header + body


def init(target):
    """Write TARGET/run.toml and TARGET/drafter.py; return the paths written. Nothing is written if either exists."""
    name = os.path.basename(os.path.normpath(target))
    if not NAME_RE.fullmatch(name):
        raise StarterError(f"{target!r}: the directory's name is the run's name: letters, digits, '.', '_', '-' "
                           "(at most 64, not starting with '.' or '-')")
    if os.path.exists(target) and not os.path.isdir(target):
        raise StarterError(f"{target}: exists and is not a directory; nothing was written")
    src_drafter = os.path.join(data_dir("examples"), EXAMPLE, "drafter.py")
    with open(src_drafter, encoding="utf-8") as f:
        drafter = f.read()
    files = {"run.toml": starter_toml(name), "drafter.py": drafter}
    paths = [os.path.join(target, f) for f in files]
    there = [p for p in paths if os.path.lexists(p)]
    if there:
        raise StarterError(f"{', '.join(there)}: exists; nothing was written (choose another NAME, or move it away)")
    os.makedirs(target, exist_ok=True)
    written = []
    try:
        for (fname, text), path in zip(files.items(), paths):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            written.append(path)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
    except OSError:
        for p in written:  # a race with another writer, or a full disk: leave no half starter behind
            os.unlink(p)
        raise
    return paths


def main(argv=None):
    p = argparse.ArgumentParser(prog="dflash-launch init",
                                description="Write NAME/run.toml and NAME/drafter.py: a starter run from "
                                            f"examples/{EXAMPLE} that runs from the wheel (no overwrite).")
    p.add_argument("name", metavar="NAME", help="the run's directory (created if missing); its name names the run")
    args = p.parse_args(argv)
    try:
        paths = init(args.name)
    except (StarterError, OSError) as e:
        print(f"dflash-launch init: error: {e}", file=sys.stderr)
        return 1
    for path in paths:
        print(f"wrote {path}")
    print(f"next: dflash-launch check {paths[0]} && dflash-launch run {paths[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
