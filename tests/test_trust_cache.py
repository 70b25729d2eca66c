"""Trust, second round, for the cache (issue #38 items 3 and 4): a cache archive is code (kernels Inductor
dlopens, pickles it unpickles), so `cache import` takes only an archive signed with the importing user's own key
(made by their `cache export`) or one they vouch for with --trust; and a group-write bit is "private" only if
nobody but us is in the group, by /etc/group or by their primary gid, in the cache dir and below it alike."""
import contextlib
import io
import os
import pathlib
import pickle
import pwd
import shutil
import struct
import subprocess
import tarfile
import tempfile
import uuid

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


# ---- item 4: who else a group-write bit lets in ----

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: local users are made with useradd")


@contextlib.contextmanager
def local_user(*useradd_args):
    """A throw-away local user (useradd), removed at the end, also on failure."""
    if shutil.which("useradd") is None:
        pytest.skip("no useradd")
    name = "dfg" + uuid.uuid4().hex[:8]
    r = run(["useradd", "--no-create-home", "--shell", "/bin/sh", *useradd_args, name])
    if r.returncode != 0:
        pytest.skip(f"useradd failed: {r.stderr.strip()}")
    try:
        yield pwd.getpwnam(name)
    finally:
        run(["userdel", name])
        run(["groupdel", name])  # a --user-group's group, if userdel left it


def as_user(pw, args, gid=None):
    return run(args, user=pw.pw_uid, group=pw.pw_gid if gid is None else gid, extra_groups=[],
               env={"PATH": "/usr/bin:/bin", "HOME": "/", "DFLASH_ARCHIVE_KEY": "/nonexistent"}, cwd="/")


def reachable_dir():
    """A dir others may enter (0755, like a home dir): where another user's write could matter."""
    d = pathlib.Path(tempfile.mkdtemp(prefix="dflash-grp-"))
    d.chmod(0o755)
    return d


@needs_root
def test_a_user_whose_primary_group_is_roots_makes_a_group_writable_subdir_unsafe(bin_dir):
    """Before: /etc/group lists no member of root's group, so a group-writable dynamo/ in root's cache counted as
    private, though a user whose *primary* gid is 0 could write it (and planted a precompile entry root's run
    unpickled). Now: `check` and the gate refuse it, naming that user; the write is shown to be possible."""
    base = reachable_dir()
    try:
        with local_user("--gid", "0", "--no-user-group") as member:
            cache = base / "cache"
            cache.mkdir(mode=0o750)
            dynamo = cache / "dynamo"
            dynamo.mkdir()
            dynamo.chmod(0o770)
            cfg = config(base, cache)
            r = launch(bin_dir, "check", cfg)
            assert r.returncode == 2, r.stdout + r.stderr
            assert f"{dynamo} is writable by its group (mode 0770; {member.pw_name} (uid {member.pw_uid}) has root " \
                   "as primary group)" in r.stderr, r.stderr
            gate = run([bin_dir / "dflash-cachelock-run", cache, "--key", "k", "--", "true"])
            assert gate.returncode == 73 and member.pw_name in gate.stderr, gate.stderr
            # The hazard is real: that user can plant an entry there.
            planted = as_user(member, ["sh", "-c", f"echo x > {dynamo}/planted"], gid=0)
            assert planted.returncode == 0, planted.stderr
    finally:
        shutil.rmtree(base, ignore_errors=True)


def posix_acl(*entries):
    """A system.posix_acl_access value (linux/posix_acl_xattr.h): version 2, (tag, perm, id) entries in order."""
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", tag, perm, uid) for tag, perm, uid in entries)


@needs_root
def test_an_acl_that_names_another_user_is_not_a_private_group(bin_dir):
    """A user's own cache (umask 002: fxgraph/ 0770 of their user private group) passes, as before. Before: the same
    dir with an access ACL granting `nobody` rwx passed too (its group bits, the ACL's mask, were read as the
    private group's). Now: refused, naming the ACL; `nobody` is shown to be able to write there."""
    with local_user("--user-group") as owner:
        base = reachable_dir()
        try:
            os.chown(base, owner.pw_uid, owner.pw_gid)
            cache = base / "cache"
            cache.mkdir(mode=0o700)
            cache.chmod(0o711)  # others may pass through, as in a home dir
            sub = cache / "fxgraph"
            sub.mkdir()
            sub.chmod(0o770)
            for p in (cache, sub):
                os.chown(p, owner.pw_uid, owner.pw_gid)
            cfg = config(base, cache)
            os.chown(cfg, owner.pw_uid, owner.pw_gid)
            ok = as_user(owner, [bin_dir / "dflash-launch", "check", cfg])
            assert ok.returncode == 0, ok.stdout + ok.stderr  # a umask of 002 with a user private group is fine
            UNDEF = 0xFFFFFFFF
            try:
                os.setxattr(sub, "system.posix_acl_access", posix_acl(
                    (0x01, 7, UNDEF), (0x02, 7, NOBODY), (0x04, 7, UNDEF), (0x10, 7, UNDEF), (0x20, 0, UNDEF)))
            except OSError as e:
                pytest.skip(f"no POSIX ACLs here: {e}")
            assert oct(sub.stat().st_mode & 0o777) == "0o770"
            r = as_user(owner, [bin_dir / "dflash-launch", "check", cfg])
            assert r.returncode == 2, r.stdout + r.stderr
            assert f"{sub} is writable by its group (mode 0770; and the users and groups its ACL names" in r.stderr, \
                r.stderr
            planted = run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "sh", "-c",
                           f"echo x > {sub}/planted"])
            assert planted.returncode == 0, planted.stderr
        finally:
            shutil.rmtree(base, ignore_errors=True)
