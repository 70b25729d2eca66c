"""A config module as training code has one: the process's rank, read once at import (tests/payloads/identity_step.py
reads it through the module)."""
import os

RANK = int(os.environ["ROLE_RANK"])
