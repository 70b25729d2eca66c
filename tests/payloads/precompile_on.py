"""A gated payload that runs with Dynamo's precompile cache on, by the way its argument names, then says READY and
keeps running (tests/test_cpu_identity.py): the worker must refuse it where it takes effect. `script`: the script
turns it on itself; `env`/`shell`: a wrapper in the command set TORCH_CACHING_PRECOMPILE=1 or ATEN_CPU_CAPABILITY."""
import os
import sys
import time

import torch._dynamo.config

import dflash_launch

if sys.argv[1:] == ["script"]:
    torch._dynamo.config.caching_precompile = True
dflash_launch.notify_ready()
with open(os.environ["DFLASH_METRICS_FILE"], "w") as out:  # what it would go on to do: train, with exit 0
    out.write('{"trained": true}')
time.sleep(600)  # the worker kills it long before
