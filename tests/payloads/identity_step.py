"""Compiled functions whose values depend on what makes this process itself, or on which object it was handed
(issues #37 and #44). Each case runs compiled and eager, and the payload writes to $DFLASH_METRICS_FILE, per case:
whether every compiled result equals its eager one, how many FX-graph lookups (hits + misses) and misses its calls
made here (a miss: Inductor compiled it in this process), and whether Dynamo's precompile cache was on.

- what the process is: its rank and world size (constant folds, a ProcessGroup's methods), its environment
  (os.environ, os.getenv), a config module's attribute, a function, an Enum member, an IntEnum and a compiled `re`
  pattern picked by rank, a rank-dependent slice, a user package named like a stdlib module (`code`);
- what the call is handed: one compiled function called with torch.relu, then torch.tanh, then torch.sigmoid; an
  Enum argument (TRAIN, then EVAL); a global function rebound after the first call; two lambdas on one line that
  differ only by a constant; functools.partial; random.randint inside the step; a module-level torch.Generator;
- and one that reads nothing of either (rank_free: compiled once, by the leader, and loaded by everyone else).
Extern kernels (matrix products) wherever the case allows, so that most cases cost Dynamo's trace and no C++ build;
pointwise cases are compared with a tolerance far below what another function's values would differ by.

IDENTITY_WORLD=gloo joins the role's world (the gate's warm-up mode: its processes start together; a warm-up is a
world of one); IDENTITY_WORLD=fake joins torch's fake process group at the process's own rank and the role's size
(serial mode and the cluster gate: the processes take the gate one by one, none can wait for its peers)."""
import enum
import functools
import json
import os
import random
import re
import sys

import torch
import torch.distributed as dist
from torch._dynamo.utils import counters

import identity_conf
from dflash_launch import init_process_group, notify_ready
from leave_world import leave

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "stdlib_named"))
import code as user_code  # noqa: E402  -- the user's package, not the standard library's
assert user_code.__file__.endswith(os.path.join("stdlib_named", "code", "__init__.py")), user_code.__file__

rank, world = int(os.environ["ROLE_RANK"]), int(os.environ["ROLE_WORLD_SIZE"])
if os.environ.get("IDENTITY_WORLD") == "fake":
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
else:
    init_process_group("gloo")  # the role's world (a warm-up's: a world of one)


class Mode(enum.Enum):
    TRAIN = "train"
    EVAL = "eval"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


def times(a, b):
    return torch.mm(a, b)


def times_swapped(a, b):
    return torch.mm(b, a)


# Globals picked by rank: each names another object in odd ranks.
PICK = times if rank % 2 == 0 else times_swapped
MODE = Mode.TRAIN if rank % 2 == 0 else Mode.EVAL
LEVEL = Level.LOW if rank % 2 == 0 else Level.HIGH
PATTERN = re.compile("a+") if rank % 2 == 0 else re.compile("b+")
GENERATOR = torch.Generator().manual_seed(1000 + rank)
# Two lambdas on one line that differ only by a constant, picked by rank: one qualname, one first line.
SCALED = (lambda x, w: torch.addmm(x, x, w, alpha=2)) if rank % 2 == 0 else (lambda x, w: torch.addmm(x, x, w, alpha=3))  # noqa: E501


def rank_free(x, w):
    return torch.mm(x, w)


def world_and_rank(x, w):  # the x * world_size + rank, as one extern kernel
    return torch.addmm(x, x, w, beta=dist.get_world_size(), alpha=dist.get_rank() + 1)


def group_methods(x, w):
    return torch.addmm(x, x, w, beta=dist.group.WORLD.size(), alpha=dist.group.WORLD.rank() + 1)


def environ(x, w):
    return torch.addmm(x, x, w, alpha=int(os.environ["ROLE_RANK"]) + 1)


def getenv(x, w):  # os.getenv reads os.environ from the os module's globals, where Dynamo installs no guard
    return torch.addmm(x, x, w, alpha=int(os.getenv("ROLE_RANK")) + 1)


def module_attribute(x, w):
    return torch.addmm(x, x, w, alpha=identity_conf.RANK + 1)


def picked(x, w):
    return PICK(x, w)


def picked_enum(x, w):
    return torch.mm(x, w) if MODE is Mode.TRAIN else torch.mm(w, x)


def picked_int_enum(x, w):
    return torch.addmm(x, x, w, alpha=int(LEVEL))


def picked_pattern(x, w):
    return torch.addmm(x, x, w, alpha=len(PATTERN.pattern) + (PATTERN.pattern == "b+"))


def rank_slice(x, w):
    r = dist.get_rank() % 4
    return torch.mm(x[r:r + 1], w)


def stdlib_named_package(x, w):
    return user_code.scaled(x, w)


def uses_partial(x, w, alpha):
    return torch.addmm(x, x, w, alpha=alpha)


def uses_random(x, w):
    return torch.addmm(x, x, w, alpha=random.randint(1, 1000))


def uses_generator(x, w):
    return torch.mm(x + torch.rand(x.shape, generator=GENERATOR), w)


def apply(x, fn):
    return fn(x)


def branch(x, w, mode):
    return torch.mm(x, w) if mode is Mode.TRAIN else torch.mm(w, x)


def rebindable(x, w):
    return torch.mm(x, w)


def calls_rebindable(x, w):
    return rebindable(x, w)


def same(a, b, exact):
    if isinstance(a, tuple):
        return all(same(p, q, exact) for p, q in zip(a, b))
    return torch.equal(a, b) if exact else torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def one_call(fn, exact=True):
    """A case of one compiled call: fn(x, w) against itself, eager."""
    def case():
        return [(torch.compile(fn)(x, w), fn(x, w), exact)]
    case.__name__ = fn.__name__
    return case


def through_one_compiled_function():  # relu, then tanh, then sigmoid, through one compiled `apply`
    c = torch.compile(apply)
    return [(c(x, f), apply(x, f), False) for f in (torch.relu, torch.tanh, torch.sigmoid)]


def enum_argument():
    c = torch.compile(branch)
    return [(c(x, w, m), branch(x, w, m), True) for m in (Mode.TRAIN, Mode.EVAL)]


def rebound_global():
    global rebindable
    c = torch.compile(calls_rebindable)
    first = (c(x, w), calls_rebindable(x, w), True)
    rebindable = times_swapped  # rebound after the first call: the next call must run the new one
    return [first, (c(x, w), calls_rebindable(x, w), True)]


def lambdas_by_constant():
    return [(torch.compile(SCALED)(x, w), SCALED(x, w), True)]


def functools_partial():
    p = functools.partial(uses_partial, alpha=rank + 1)
    return [(torch.compile(p)(x, w), p(x, w), True)]


def random_in_the_step():
    random.seed(rank)
    compiled = torch.compile(uses_random)(x, w)
    random.seed(rank)
    return [(compiled, uses_random(x, w), True)]


def module_level_generator():
    GENERATOR.manual_seed(1000 + rank)
    compiled = torch.compile(uses_generator)(x, w)
    GENERATOR.manual_seed(1000 + rank)
    return [(compiled, uses_generator(x, w), False)]


CASES = [one_call(f) for f in (rank_free, world_and_rank, group_methods, environ, getenv, module_attribute, picked,
                               picked_enum, picked_int_enum, picked_pattern, rank_slice, stdlib_named_package)]
CASES += [lambdas_by_constant, through_one_compiled_function, enum_argument, rebound_global, functools_partial, random_in_the_step,
          module_level_generator]


def lookups():
    ind = counters["inductor"]
    return int(ind["fxgraph_cache_hit"]), int(ind["fxgraph_cache_miss"])


x = torch.arange(16, dtype=torch.float32).reshape(4, 4) / 7 - 1
w = torch.arange(16, dtype=torch.float32).flip(0).reshape(4, 4) / 5
results = {}
for case in CASES:
    hits, misses = lookups()
    try:
        pairs = case()
        equal, error = all(same(c, e, exact) for c, e, exact in pairs), None
    except Exception as e:  # noqa: BLE001 -- a case that raises is a finding, reported like a wrong value
        equal, error = False, f"{type(e).__name__}: {e}"
    hits2, misses2 = lookups()
    results[case.__name__] = {"equal": equal, "error": error, "lookups": hits2 - hits + misses2 - misses,
                              "misses": misses2 - misses}
metrics = {"functions": results, "rank": rank, "world": world,
           "caching_precompile": bool(torch._dynamo.config.caching_precompile),
           "dynamo_cache_hit": int(counters["dynamo_cache"]["dynamo_cache_hit"])}
with open(os.environ["DFLASH_METRICS_FILE"] + ".tmp", "w") as f:
    json.dump(metrics, f)
os.replace(os.environ["DFLASH_METRICS_FILE"] + ".tmp", os.environ["DFLASH_METRICS_FILE"])
notify_ready(f"rank {rank}/{world}: {sum(r['equal'] for r in results.values())} of {len(results)} equal")
if os.environ.get("IDENTITY_WORLD") != "fake":
    dist.barrier()  # a warm-up's world of one, or the role's: nobody tears gloo down under a peer
leave(0)
