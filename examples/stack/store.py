"""The stack's store (the role Mooncake's master plays in SpecForge): a redis-server on the port the launcher
reserved for this process (ports = ["redis"] -> DFLASH_PORT_REDIS), on loopback, nothing persisted. The
password comes from a 0600 file the launcher never sees in argv (STACK_PASSWORD_FILE), so another local
user cannot write frames into it."""
import os
import sys
import tempfile

port = os.environ["DFLASH_PORT_REDIS"]
conf = ["bind 127.0.0.1", f"port {port}", 'save ""', "appendonly no", "protected-mode yes"]
password_file = os.environ.get("STACK_PASSWORD_FILE")
if password_file:
    conf.append("requirepass " + open(password_file).read().strip())
fd, path = tempfile.mkstemp(prefix="stack-redis-", suffix=".conf")  # 0600: the password stays ours
with os.fdopen(fd, "w") as f:
    f.write("\n".join(conf) + "\n")
print(f"store: redis-server on 127.0.0.1:{port}", flush=True)
os.execvp("redis-server", ["redis-server", path])
sys.exit("store: redis-server could not be executed")
