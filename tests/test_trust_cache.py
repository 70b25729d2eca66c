"""Trust, second round, for the cache (issue #38 items 3 and 4): a cache archive is code (kernels Inductor
dlopens, pickles it unpickles), so `cache import` takes only an archive signed with the importing user's own key
(made by their `cache export`) or one they vouch for with --trust; and a group-write bit is "private" only if
nobody but us is in the group, by /etc/group or by their primary gid, in the cache dir and below it alike."""
import io
import os
import pickle
import shutil
import subprocess
import tarfile

import pytest

from conftest import run
from test_adversarial_cache import config, entry, launch, make_archive, manifest

NOBODY = 65534


class Planted:
    """What the hostile archive's precompile entry unpickles to: a command run as whoever loads the cache."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"id -u > {self.marker}",))


def hostile_archive(tmp_path, name="hostile.tar.gz"):
    """What another user hands over: a well-formed archive whose dynamo/ entry is a pickle that runs a command."""
    rel = "dynamo/0123456789abcdef/entry"
    data = pickle.dumps(Planted(tmp_path / "ran-as"))
    archive = tmp_path / name
    make_archive(archive, manifest([entry(rel, data)], torch="none"), [(rel, len(data), io.BytesIO(data))])
    return archive, rel


def fresh_cache(tmp_path, name="cache"):
    cache = tmp_path / name
    cache.mkdir(mode=0o700)
    (cache / "fxgraph/ab/fabx").mkdir(parents=True)
    (cache / "fxgraph/ab/fabx/e").write_bytes(b"entry")
    return cache


def test_an_unsigned_archive_is_refused_before_anything_is_written(bin_dir, tmp_path):
    """Before: the hostile archive was imported (exit 0) and its pickle sat in dynamo/, where the next gated
    process's precompile loader unpickled it. Now: refused, the cache untouched, the refusal says an archive
    is code and names --trust."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    archive, rel = hostile_archive(tmp_path)
    r = launch(bin_dir, "cache", "import", config(tmp_path, cache), archive, "--force")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "not signed" in r.stderr and "is code" in r.stderr and "--trust" in r.stderr, r.stderr
    assert "the cache is untouched" in r.stderr
    assert not (cache / rel).exists() and not (cache / "dynamo").exists()
    # What it carries is code: unpickling the entry (what torch's precompile loader does) runs the command.
    with tarfile.open(archive) as tar:
        pickle.loads(tar.extractfile(rel).read())
    assert (tmp_path / "ran-as").read_text().strip() == str(os.getuid())


def test_a_forged_or_foreign_signature_is_refused_and_ones_own_export_imports(bin_dir, tmp_path):
    """An archive exported with another key (another user's, another machine's) or carrying a made-up signature
    is refused; the user's own export imports; --trust imports what the user vouches for."""
    src = fresh_cache(tmp_path, "src")
    cfg_src = config(tmp_path, src)
    other_key = tmp_path / "other" / "archive.key"
    theirs = tmp_path / "theirs.tar.zst"
    r = launch(bin_dir, "cache", "export", cfg_src, theirs, env=dict(os.environ, DFLASH_ARCHIVE_KEY=str(other_key)))
    assert r.returncode == 0, r.stderr
    assert oct(other_key.stat().st_mode & 0o777) == "0o600"
    mine = tmp_path / "mine.tar.zst"
    r = launch(bin_dir, "cache", "export", cfg_src, mine)
    assert r.returncode == 0 and "signed with" in r.stdout, r.stdout + r.stderr
    # A made-up signature beside the hostile manifest.
    forged = tmp_path / "forged.tar"
    archive, rel = hostile_archive(tmp_path)
    subprocess.run(["tar", "-xzf", archive, "-C", tmp_path], check=True)
    (tmp_path / "manifest.sig").write_text("0" * 64)
    subprocess.run(["tar", "-cf", forged, "-C", tmp_path, "manifest.json", "manifest.sig", rel], check=True)

    dst = tmp_path / "dst"
    dst.mkdir(mode=0o700)
    cfg = config(tmp_path, dst)
    for bad, says in ((theirs, "not signed with your archive key"), (forged, "not signed with your archive key")):
        r = launch(bin_dir, "cache", "import", cfg, bad, "--force")
        assert r.returncode == 1 and says in r.stderr, (bad, r.stderr)
        assert not (dst / "fxgraph").exists() and not (dst / "dynamo").exists()
    r = launch(bin_dir, "cache", "import", cfg, mine)
    assert r.returncode == 0, r.stderr
    assert (dst / "fxgraph/ab/fabx/e").read_bytes() == b"entry"
    r = launch(bin_dir, "cache", "import", cfg, theirs, "--trust")
    assert r.returncode == 0, r.stderr
