"""The shipped roles: processes a run.toml names in a command (`python -m dflash_launch.roles.NAME`)."""
