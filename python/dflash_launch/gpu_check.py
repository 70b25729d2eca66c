"""Moved to dflash_launch.tools.gpu_check (issue #48). This name warns and stays for one release
(dflash_launch/_moved.py)."""
from dflash_launch._moved import moved_to

moved_to(__name__, "dflash_launch.tools.gpu_check")
