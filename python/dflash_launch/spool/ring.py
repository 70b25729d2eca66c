"""Moved (issue #56): the ring of reused frame files is libdflash_spool.so's (spool/spool_ring.h). This name warns
and stays for one release (dflash_launch/_moved.py)."""
from dflash_launch._moved import moved_to

moved_to(__name__, "dflash_launch.spool")
