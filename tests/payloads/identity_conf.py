"""A config module as training code has one: the process's rank, read once at import (tests/payloads/identity_step.py
reads it through the module, where Dynamo's precompile rebuilds the guard from the loading process's own value)."""
import os

RANK = int(os.environ["ROLE_RANK"])
