"""The shipped tools that are not roles: the GPU check, the demo's report, `dflash-launch init`'s starters."""
