"""A user package named like a standard-library module (`code`): Dynamo installs no guard on globals read inside
modules whose name is a stdlib module's, so under a shared trace a follower read the leader's RANK (issue #44)."""
import os

import torch

RANK = int(os.environ["ROLE_RANK"])


def scaled(x, w):
    return torch.addmm(x, x, w, alpha=RANK + 1)
