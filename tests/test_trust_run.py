"""Trust, second round, for what a run writes and reads (issue #38 items 5 and 6): an attempt log that cannot be
opened is a loud warning, never a SIGPIPE for the payload; a resumed run's files must be its own; another
user's bytes in a lock file reach the terminal escaped; another user squatting the default spool dir does not
block the config's runs."""
import json
import os
import sys

from supervise import Run, write_config

# Attempt 0 swaps attempt_1..attempt_9 of its run dir for plain files (a cleanup job, a full inode table, a
# careless user: the next attempts' logs cannot be opened), then fails; attempt 1 writes 2000 lines and succeeds.
SWAPPER = r"""
import os, sys
run_dir, attempt = os.environ["DFLASH_RUN_DIR"], int(os.environ["DFLASH_ATTEMPT"])
if attempt == 0:
    for k in range(1, 10):
        open(os.path.join(run_dir, f"attempt_{k}"), "w").close()
    sys.exit(3)
for i in range(2000):
    print(f"line {i} of attempt {attempt}")
sys.stderr.write("and a word on stderr\n")
"""


def test_a_log_that_cannot_be_opened_is_a_warning_and_the_payload_runs_on(bin_dir, tmp_path):
    """Before: the pipe of a process whose log could not be opened was closed, so its first write killed it with
    SIGPIPE; every restart did the same, the budget burned, the run ended 141 and summary.json said nothing of
    the logs. Now: the pipe is drained to the console, the attempt succeeds, the run ends 0, and the console,
    supervisor.log and summary.json's warnings say which log could not be opened and why."""
    (tmp_path / "swap.py").write_text(SWAPPER)
    config = write_config(tmp_path, f"""
        [[role]]
        name = "p"
        cpu = 1
        command = [{json.dumps(sys.executable)}, {json.dumps(str(tmp_path / "swap.py"))}]
        restart = {{ policy = "on-failure", max = 3, window = "1h", backoff = "100ms..100ms" }}
        """)
    r = Run(bin_dir, config, "ll")
    rc = r.wait()
    said = r.out + r.err
    assert rc == 0, said
    log = (r.run_dir / "attempt_1/p-0.stdout.log")
    assert "cannot log to " + str(log) in said and "shown on the console only" in said, said
    assert "[p:0] line 1999 of attempt 1" in said and "[p:0] and a word on stderr" in said  # nothing lost
    summary = r.summary()
    assert [p["attempts"][-1]["exit_code"] for p in summary["processes"]] == [0], summary
    warnings = " ".join(summary["warnings"])
    assert f"p:0: cannot log to {log}" in warnings and "p-0.stderr.log" in warnings, summary["warnings"]
    assert "cannot log to" in (r.run_dir / "supervisor.log").read_text()
