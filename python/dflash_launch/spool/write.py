"""Moved (issue #56): its SpoolFull, default_max_bytes and spool_bytes are dflash_launch.spool's; the write itself is
libdflash_spool.so's. This name warns and stays for one release (dflash_launch/_moved.py)."""
from dflash_launch._moved import moved_to

moved_to(__name__, "dflash_launch.spool")
