"""Moved (issue #56): the fixed order is libdflash_spool.so's (spool/spool_order.h), dealt by WorldSource. This name
warns and stays for one release (dflash_launch/_moved.py)."""
from dflash_launch._moved import moved_to

moved_to(__name__, "dflash_launch.spool")
