"""`python -m dflash_launch.hf_target`, the name configs used before the roles moved to dflash_launch.roles
(issue #48): it runs dflash_launch.roles.hf_target, after a line that says the new name. Kept because run.toml
files written before the move (by hand, or by `dflash-launch init` from the shipped examples) name it; docs/design.md
says why.
Nothing imports it; new configs name dflash_launch.roles.hf_target."""
import sys

from dflash_launch.roles.hf_target import main

if __name__ == "__main__":
    print("dflash_launch.hf_target moved to dflash_launch.roles.hf_target: name that in run.toml's command",
          file=sys.stderr, flush=True)
    main()
