"""A Python target for tests/test_checkpoint.py: publishes CKPT_FRAMES frames of [model] through the spool, each
made from its producer's name and sequence number alone (so every run publishes the same frames), then its end
marker; and the shared weights (the first publisher's). CKPT_PUBLISH_MS: a pause before each frame (a slow producer)."""
import os
import signal
import time
import zlib

import torch

from dflash_launch import contract_from_env
from dflash_launch.spool import SpoolProducer

# A forwarded preemption notice (forward_signals) reaches every process: a producer has nothing to save (it resumes
# after its last published frame), so it lets the drafters take it.
signal.signal(signal.SIGUSR1, signal.SIG_IGN)
contract = contract_from_env()
producer = SpoolProducer.from_env(contract, max_ready=4)
width = len(contract["tapped_layers"]) * contract["hidden"]
g = torch.Generator().manual_seed(0)  # the target's embedding and LM head (the reference drafter shares them)
producer.publish_weights(torch.randn(contract["vocab"], contract["hidden"], generator=g) * 0.02,
                         torch.randn(contract["vocab"], contract["hidden"], generator=g) * 0.02)
pause = float(os.environ.get("CKPT_PUBLISH_MS", "0")) / 1000
for seq in range(producer.next_seq, int(os.environ.get("CKPT_FRAMES", "15"))):
    g = torch.Generator().manual_seed(zlib.crc32(f"{producer.name}/{seq}".encode()))
    hidden = torch.randn(contract["batch"], contract["seq_len"], width, generator=g)
    tokens = torch.randint(0, contract["vocab"], (contract["batch"], contract["seq_len"]), generator=g)
    time.sleep(pause)
    producer.publish(hidden, tokens)
producer.finish()
