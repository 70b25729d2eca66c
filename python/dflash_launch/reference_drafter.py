"""`python -m dflash_launch.reference_drafter`, the name configs used before the roles moved to dflash_launch.roles
(issue #48): it runs dflash_launch.roles.reference_drafter, after a line that says the new name. Kept because run.toml
files written before the move (by hand, or by `dflash-launch init` from the shipped examples) name it; docs/design.md
says why.
Imported (not run), it is that module, with a DeprecationWarning (dflash_launch/_moved.py).
New configs name dflash_launch.roles.reference_drafter."""

import sys

if __name__ == "__main__":
    from dflash_launch.roles.reference_drafter import main

    print("dflash_launch.reference_drafter moved to dflash_launch.roles.reference_drafter: name that in run.toml's "
          "command", file=sys.stderr, flush=True)
    main()
else:
    from dflash_launch._moved import moved_to

    moved_to(__name__, "dflash_launch.roles.reference_drafter")
