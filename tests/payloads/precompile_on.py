"""A gated payload that changes what it compiles with, by the way its argument names, then says READY and keeps
running (tests/test_cpu_identity.py): the worker must refuse it where it takes effect. `script`: the script turns
Dynamo's precompile cache on itself; `script_isa`: it sets ATEN_CPU_CAPABILITY in os.environ before torch picks its
vector ISA; `wrapper`: a wrapper in the command set TORCH_CACHING_PRECOMPILE=1 or ATEN_CPU_CAPABILITY."""
import os
import sys
import time

if sys.argv[1:] == ["script_isa"]:
    os.environ["ATEN_CPU_CAPABILITY"] = "default"

import torch._dynamo.config  # noqa: E402
import torch.compiler.config  # noqa: E402,F401

import dflash_launch  # noqa: E402

if sys.argv[1:] == ["script"]:
    torch._dynamo.config.caching_precompile = True
dflash_launch.notify_ready()
with open(os.environ["DFLASH_METRICS_FILE"], "w") as out:  # what it would go on to do: train, with exit 0
    out.write('{"trained": true}')
time.sleep(600)  # the worker kills it long before
