"""A target server of the stack (what an SGLang capture server is in SpecForge's disaggregated mode): a tiny
random Qwen3 built from [model] (dflash_launch.roles.hf_target), behind HTTP on the port the launcher reserved
(ports = ["http"] -> DFLASH_PORT_HTTP). It binds only once the model is loaded, so its /health answers
when it can serve:

  GET /health            200 "ok"
  GET /hidden?sample=N   the tapped hidden states of sample N, concatenated [batch, seq, n_taps*hidden],
                         put into the store (bulk never crosses HTTP) under a fresh key; the answer is
                         JSON {"key", "shape", "dtype", "tokens"}. Sample N is the same on every server.

STACK_FAIL_AFTER=N (tests): the process kills itself with SIGKILL after serving N samples, once per run
(a marker file in STACK_STATE_DIR), as a crashed server would."""
import json
import os
import signal
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

from dflash_launch import contract_from_env
from dflash_launch.roles.hf_target import TokenSource, random_qwen3
from resp import Redis

contract = contract_from_env()
if not contract:
    sys.exit("target_server: run me under dflash-launch")
name = os.environ.get("DFLASH_PROCESS", "target")
port = int(os.environ["DFLASH_PORT_HTTP"])
store_port = os.environ["DFLASH_STORE_REDIS_PORTS"].split(",")[0]
password = open(os.environ["STACK_PASSWORD_FILE"]).read().strip() if os.environ.get("STACK_PASSWORD_FILE") else None
fail_after = int(os.environ.get("STACK_FAIL_AFTER", "0"))
state_dir = os.environ.get("STACK_STATE_DIR", "")
torch.set_num_threads(1)
model = random_qwen3(contract, torch).eval()
tokens = TokenSource(torch, contract, None, 0, 1)  # the same samples on every server
taps = contract["tapped_layers"]
lock = threading.Lock()
served = 0


def hidden_of(sample):
    ids = tokens.frame(sample)
    with torch.no_grad():
        out = model(ids, output_hidden_states=True, use_cache=False)
    return ids, torch.cat([out.hidden_states[i + 1] for i in taps], dim=-1).float().contiguous()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # one line per request would drown the run's log
        pass

    def answer(self, code, body, kind="application/json"):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        global served
        url = urllib.parse.urlparse(self.path)
        if url.path == "/health":
            return self.answer(200, "ok", "text/plain")
        if url.path != "/hidden":
            return self.answer(404, json.dumps({"error": "no such path"}))
        try:
            sample = int(urllib.parse.parse_qs(url.query)["sample"][0])
        except (KeyError, ValueError):
            return self.answer(400, json.dumps({"error": "sample=N wanted"}))
        with lock:
            ids, hidden = hidden_of(sample)
            key = f"stack:{os.environ.get('DFLASH_RUN_ID', 'run')}:{name}:{sample}:{time.monotonic_ns()}"
            store = Redis(store_port, password=password)
            store.cmd("SET", key, hidden.numpy().tobytes(), "EX", "600")
            store.close()
            served += 1
            crash = fail_after and served >= fail_after and state_dir and not os.path.exists(
                os.path.join(state_dir, f"{name}.crashed"))
        self.answer(200, json.dumps({"key": key, "shape": list(hidden.shape), "dtype": "float32",
                                     "tokens": ids.tolist()}))
        if crash:
            open(os.path.join(state_dir, f"{name}.crashed"), "w").write(str(served))
            os.kill(os.getpid(), signal.SIGKILL)


server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
print(f"{name}: serving taps {taps} of {contract['target_layers']} layers on 127.0.0.1:{port}", flush=True)
server.serve_forever()
print(f"{name}: stopped after {served} samples", flush=True)
