"""The spool's layout as Python names it (Paths), where a run's spool and manifest are, and the calls on the whole
spool: the manifest, the byte budget, private directories. Every state move is libdflash_spool.so's (_native)."""

import os

from dflash_launch.spool import _native
from dflash_launch.spool.format import SpoolError


class Paths:
    """A spool's directories as attributes (.ready, .claimed, ...), named by the library (contract/spool_layout.h)."""

    def __init__(self, root):
        self.root, names = str(root), _native.layout()
        self.states = names["states"]
        for state, d in self.states.items():
            setattr(self, state, os.path.join(self.root, d))
        self.weights = os.path.join(self.root, names["weights_file"])

    def claimed_by(self, consumer):
        return os.path.join(self.claimed, consumer)

    def pending_of(self, consumer):  # <position:010d>.<frame>, awaiting a checkpoint (docs/checkpoints.md)
        return os.path.join(self.pending, consumer)

    def create(self):
        """Every state's directory but pending/ (only a consumer that checkpoints makes it), 0700, refused where
        another user could swap them (SpoolError)."""
        for d in (self.root,) + tuple(getattr(self, s) for s in self.states if getattr(self, s) != self.pending):
            private_makedirs(d)


def private_makedirs(path):
    """mkdir -p `path` (0700) the way the builtin roles do (common/private_files.h): a directory another user
    owns, made first or could swap is refused (SpoolError), never joined."""
    _native.call("dfs_make_private_dir", _native.fs(os.path.abspath(str(path))))


def spool_root_from_env(env):
    """$DFLASH_SPOOL_DIR (a from_env constructor's spool), or SpoolError saying who sets it."""
    root = env.get("DFLASH_SPOOL_DIR")
    if not root:
        raise SpoolError("DFLASH_SPOOL_DIR is not set: the spool directory frames go through "
                         "(dflash-launch sets it to <[run] spool_dir>/<run_id>)")
    return root


def default_manifest_path(root, env=None):
    env = os.environ if env is None else env
    run_dir = env.get("DFLASH_RUN_DIR")
    return os.path.join(run_dir, "spool.json") if run_dir else os.path.join(str(root), "spool.json")


def default_max_bytes(root, env=None):
    """The byte budget: $DFLASH_SPOOL_MAX_BYTES ([run] spool_max_bytes), else half the spool filesystem's free space."""
    env = os.environ if env is None else env
    out = _native.c_int64()
    _native.call("dfs_default_max_bytes", _native.fs(root), env.get("DFLASH_SPOOL_MAX_BYTES", "").encode(),
                 _native.byref(out))
    return out.value


def spool_bytes(root, owner=None):
    """The bytes the spool's frames hold against the budget (`owner`'s frames only, when given)."""
    out = _native.c_int64()
    root = root.root if isinstance(root, Paths) else root
    _native.call("dfs_spool_bytes", _native.fs(root), (owner or "").encode(), _native.byref(out))
    return out.value


def manifest(root, producers):
    """(manifest dict, final): what the spool holds (spool.h Manifest). Final when every one of `producers`
    finished and nothing is ready, claimed or pending."""
    final = _native.c_int32()
    m = _native.call_json("dfs_manifest", _native.fs(root), int(producers), _native.byref(final))
    return m, bool(final.value)


def write_manifest_if_final(root, producers, path):
    """Writes the manifest to `path` if the spool is final; True if it did (whoever makes it final sees it)."""
    written = _native.c_int32()
    _native.call("dfs_write_manifest_if_final", _native.fs(root), int(producers), _native.fs(path),
                 _native.byref(written))
    return bool(written.value)
