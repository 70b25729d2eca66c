"""Secrets stay secret (docs/config.md, "Secrets in env"): a secret-named variable's value and a URL's password,
planted in a role's `env` and in the launcher's own environment, appear in nothing the launcher prints or writes
about the run -- `check`, `check --json`, its stdout/stderr, `ctl status`, events.jsonl, summary.json, any file of
the run dir -- while the payload gets every real value."""
import json
import os
import pathlib
import sys
import uuid

from conftest import run
from supervise import Run, wait_until, write_config

ROLE_TOKEN = "hf_plantedsecret123"
ROLE_URL_PASSWORD = "p4ss"
# The launcher's own environment reaches the processes too (nothing of it is shown today; this keeps it so).
LAUNCHER_KEY = "wandbplantedlauncher456"
LAUNCHER_URL_PASSWORD = "launcherp4ssword"
SECRETS = [ROLE_TOKEN, ROLE_URL_PASSWORD, LAUNCHER_KEY, LAUNCHER_URL_PASSWORD]


def assert_hidden(where, text):
    for s in SECRETS:
        assert s not in text, f"{s!r} shown in {where}:\n{text}"


def test_planted_secrets_appear_nowhere_but_the_payload_gets_them(bin_dir, tmp_path):
    dump = tmp_path / "payload-env.json"  # outside the run dir: the one place the secrets may be
    go = tmp_path / "go"
    # It writes what it got, then stays until the test has asked `ctl status`.
    payload = (f"import json, os, time, pathlib; json.dump(dict(os.environ), open({str(dump)!r}, 'w')); "
               f"[time.sleep(0.05) for _ in range(2400) if not pathlib.Path({str(go)!r}).exists()]; "
               f"print('payload done', flush=True)")
    config = write_config(tmp_path, f"""
        [[role]]
        name = "p"
        cpu = 1
        command = [{json.dumps(sys.executable)}, "-c", {json.dumps(payload)}]
        [role.env]
        HF_TOKEN = "{ROLE_TOKEN}"
        DATABASE_URL = "postgres://u:{ROLE_URL_PASSWORD}@h/db"
        KEYBOARD = "us"
        EMPTY_TOKEN = ""
        """)
    env = dict(os.environ, WANDB_API_KEY=LAUNCHER_KEY,
               LAUNCHER_DB_URL=f"mysql://lu:{LAUNCHER_URL_PASSWORD}@db.example:3306/x")
    run_id = f"redact-{uuid.uuid4().hex[:8]}"

    text = run([bin_dir / "dflash-launch", "check", config, "--run-id", run_id], env=env)
    assert text.returncode == 0, text.stderr
    assert_hidden("check", text.stdout + text.stderr)
    # Shown redacted, not dropped: one sees the variable is set; the user and host of a URL stay.
    assert "HF_TOKEN=<redacted>" in text.stdout, text.stdout
    assert "DATABASE_URL=postgres://u:***@h/db" in text.stdout, text.stdout
    assert "KEYBOARD=us" in text.stdout, text.stdout  # a name that only contains KEY is no secret

    js = run([bin_dir / "dflash-launch", "check", config, "--json", "--run-id", run_id], env=env)
    assert js.returncode == 0, js.stderr
    assert_hidden("check --json", js.stdout + js.stderr)
    shown = json.loads(js.stdout)["processes"][0]["env"]
    assert shown["HF_TOKEN"] == "<redacted>"
    assert shown["DATABASE_URL"] == "postgres://u:***@h/db"
    assert shown["KEYBOARD"] == "us"
    assert shown["EMPTY_TOKEN"] == ""  # nothing to hide in an empty value

    r = Run(bin_dir, config, run_id=run_id, env=env)
    try:
        assert wait_until(lambda: dump.exists() and dump.stat().st_size > 0 or r.proc.poll() is not None)
        assert r.proc.poll() is None, "the run ended before its payload wrote its environment"
        got = json.loads(dump.read_text())
        # The payload gets every real value: redaction is for what is shown, never for what is run.
        assert got["HF_TOKEN"] == ROLE_TOKEN
        assert got["DATABASE_URL"] == f"postgres://u:{ROLE_URL_PASSWORD}@h/db"
        assert got["WANDB_API_KEY"] == LAUNCHER_KEY
        assert got["LAUNCHER_DB_URL"] == f"mysql://lu:{LAUNCHER_URL_PASSWORD}@db.example:3306/x"
        assert got["EMPTY_TOKEN"] == ""
        for args in (["status"], ["status", "--json"]):
            st = run([bin_dir / "dflash-launch", "ctl", run_id, *args], env=env)
            assert st.returncode == 0, st.stdout + st.stderr
            assert "p:0" in st.stdout or '"p:0"' in st.stdout, st.stdout
            assert_hidden("ctl " + " ".join(args), st.stdout + st.stderr)
    finally:
        go.touch()
    assert r.wait(timeout=120) == 0, r.err
    assert "payload done" in r.out + r.err  # the console relayed the payload: the launcher's output is all here
    assert_hidden("the launcher's stdout/stderr", r.out + r.err)
    files = [p for p in pathlib.Path(r.run_dir).rglob("*") if p.is_file() and not p.is_symlink()]
    names = {p.name for p in files}
    assert {"events.jsonl", "summary.json", "supervisor.log"} <= names, names
    for p in files:
        assert_hidden(str(p), p.read_bytes().decode(errors="replace"))


def test_a_mistyped_secret_is_not_echoed_in_the_config_error(bin_dir, tmp_path):
    config = write_config(tmp_path, """
        [[role]]
        name = "p"
        cpu = 1
        command = ["true"]
        env = { API_KEY = 8675309123, HF_TOKEN = "hf_prefixsecret\\u0000x", PLAIN = 4242 }
        """)
    r = run([bin_dir / "dflash-launch", "check", config])
    assert r.returncode == 2, r.stdout + r.stderr
    out = r.stdout + r.stderr
    assert "role[p].env: environment values are strings" in out and "a NUL at offset 15 of HF_TOKEN" in out, out
    for s in ("8675309123", "hf_prefixsecret"):
        assert s not in out, f"{s!r} echoed:\n{out}"
    assert '"4242"' in out, out  # a variable that is no secret still gets its ready-to-paste hint


# Issue #38: names and values the first list missed, each with a value that must show nowhere.
MISSED = {
    "REDISCLI_AUTH": "rediscliauth38", "SSHPASS": "sshpass38", "CI_JOB_JWT": "eyJjijobjwt38",
    "AUTHORIZATION": "Bearer authz38", "GH_PAT": "ghp_pat38", "HF_AUTH": "hfauth38",
    "SENTRY_DSN": "https://sentrykey38@o1.ingest.sentry.io/1",
    "AZURE_STORAGE_CONNECTION_STRING": "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=azkey38==;x=y",
    "PG_CONN": "host=h user=u password=pgdsn38 dbname=d",
    "NOTIFY_URL": "https://hooks.slack.com/services/T0/B0/webhook38",
}
PROBE_TOKEN = "probetoken38"


def test_the_names_and_values_round_one_missed_and_a_probe_urls_token_show_nowhere(bin_dir, tmp_path):
    """Before: every value below was printed by `check` (and the probe URL's ?token= by check, the reason, events
    and summary.json). Now: hidden in all of them; the payload still gets the real values."""
    dump = tmp_path / "env.json"
    payload = f"import json, os; json.dump(dict(os.environ), open({str(dump)!r}, 'w'))"
    env_lines = "\n".join(f"        {k} = {json.dumps(v)}" for k, v in MISSED.items())
    config = write_config(tmp_path, f"""
        [[role]]
        name = "p"
        cpu = 1
        command = [{json.dumps(sys.executable)}, "-c", {json.dumps(payload + "; import time; time.sleep(30)")}]
        ready = {{ mode = "http", url = "http://127.0.0.1:9/health?token={PROBE_TOKEN}", timeout = "1s" }}
        [role.env]
{env_lines}
        """)
    secrets = [PROBE_TOKEN, "rediscliauth38", "sshpass38", "eyJjijobjwt38", "authz38", "ghp_pat38", "hfauth38",
               "sentrykey38", "azkey38", "pgdsn38", "webhook38"]
    shown = ""
    for args in ([], ["--json"]):
        c = run([bin_dir / "dflash-launch", "check", config, *args])
        assert c.returncode == 0, c.stderr
        shown += c.stdout + c.stderr
    assert "token=***" in shown and "AccountKey=***" in shown and "password=***" in shown, shown
    r = Run(bin_dir, config, run_id="redact38")
    assert r.wait(timeout=120) == 75, r.out + r.err  # never ready: the reason names the probe URL
    shown += r.out + r.err
    for p in pathlib.Path(r.run_dir).rglob("*"):
        if p.is_file():
            shown += p.read_bytes().decode(errors="replace")
    assert "token=***" in (r.run_dir / "summary.json").read_text()
    for s in secrets:
        assert s not in shown, f"{s!r} shown"
    got = json.loads(dump.read_text())
    assert all(got[k] == v for k, v in MISSED.items())


# Issue #46 item 3: what `check` still showed, 8 of 8 -- names its list missed, and secrets under innocent names
# that only their values give away.
GH_TOKEN_VALUE = "ghp_" + "R4nd0mG1tHubT0k3nV4lu3Xy7Zq2Wp9Lm3Kd"
AZURE_KEY = "q3+Jf0Zr8WbE2nYcT5kLm9Pv1XsA7dGh4uQo6ViRy0BtCw8NaMz2KeUx5Sj3Hp1Fg9Ld7Qr4Ym6Tb0Wv2Nc8Ze=="
MISSED_46 = {
    "MYSQL_PWD": "mysqlpwd46", "DB_PW": "dbpw46", "DB_CREDS": "dbcreds46", "SECRETKEY": "secretkey46",
    "SESSIONKEY": "sessionkey46",
    "GIT_REMOTE": "https://baretoken46@git.example.com/o/r.git",
    "EXTRA_HEADER": "Authorization: Bearer bearer46",
    "HELPER_VALUE": GH_TOKEN_VALUE,
    "STORAGE_THING": AZURE_KEY,
}
# Ordinary values under ordinary names: shown as they are, not hidden by the new rules.
ORDINARY_46 = {
    "MODEL": "meta-llama/Llama-3.1-8B-Instruct", "DATA_DIR": "/data/shards/train-00001-of-00042",
    "STEPS": "1", "LR": "3e-4", "SEED": "8675309", "COMMIT": "da39a3ee5e6b4b0d3255bfef95601890afd80709",
    "RUN_UUID": "123e4567-e89b-12d3-a456-426614174000", "TORCH_CUDA_ARCH_LIST": "8.0;8.6;9.0+PTX",
    "HOSTS": "node001,node002", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
}


def test_secrets_by_name_part_and_by_value_show_nowhere_and_ordinary_values_stay(bin_dir, tmp_path):
    """Before: `check` printed every value of MISSED_46 (and the argv's --hf-token and token-shaped word).
    Now: hidden in check (text, JSON), the run's output, events, summary.json and every file of the run dir;
    the ordinary values are shown as they are; the payload still gets every real value."""
    dump = tmp_path / "env.json"
    payload = f"import json, os, sys; json.dump([dict(os.environ), sys.argv], open({str(dump)!r}, 'w'))"
    env_lines = "\n".join(f"        {k} = {json.dumps(v)}" for k, v in {**MISSED_46, **ORDINARY_46}.items())
    config = write_config(tmp_path, f"""
        [[role]]
        name = "p"
        cpu = 1
        command = [{json.dumps(sys.executable)}, "-c", {json.dumps(payload)}, "--hf-token", "argvtoken46",
                   {json.dumps(GH_TOKEN_VALUE)}]
        [role.env]
{env_lines}
        """)
    secrets = ["mysqlpwd46", "dbpw46", "dbcreds46", "secretkey46", "sessionkey46", "baretoken46", "bearer46",
               GH_TOKEN_VALUE, AZURE_KEY, "argvtoken46"]
    checks = ""
    for args in ([], ["--json"]):
        c = run([bin_dir / "dflash-launch", "check", config, *args])
        assert c.returncode == 0, c.stderr
        checks += c.stdout + c.stderr
    for k, v in ORDINARY_46.items():
        assert v in checks, f"{k}={v} hidden by check:\n{checks}"
    assert "https://***@git.example.com/o/r.git" in checks and "Bearer ***" in checks, checks
    r = Run(bin_dir, config, run_id="redact46")
    assert r.wait(timeout=120) == 0, r.out + r.err
    shown = checks + r.out + r.err
    files = [p for p in pathlib.Path(r.run_dir).rglob("*") if p.is_file() and not p.is_symlink()]
    assert {"events.jsonl", "summary.json", "supervisor.log"} <= {p.name for p in files}
    for p in files:
        shown += p.read_bytes().decode(errors="replace")
    for s in secrets:
        assert s not in shown, f"{s!r} shown"
    env, argv = json.loads(dump.read_text())
    assert all(env[k] == v for k, v in MISSED_46.items())
    assert argv[-3:] == ["--hf-token", "argvtoken46", GH_TOKEN_VALUE]


# Issue #55 item 10: eight shapes `check` still showed, in a role's env and its command (argv words and a
# `sh -c` line), each with its secret; beside them the innocent text the new rules must leave alone.
SHAPES_55 = {
    "DB_SETTINGS": '{"user": "bob", "password": "jsonpw55"}',
    "SERVICE_JSON": '{"api_key": "jsonkey55", "region": "eu"}',
    "EXTRA_HEADER": "Authorization: Token authtoken55",
    "API_HEADER": "X-Api-Key: xapikey55",
    "COPY_CMD": "sshpass -p sshpass55 scp model.bin host:/srv",
    "DUMP_CMD": "mysqldump -u root -pmysqlpw55 train",
    "NETRC_LINE": "machine files.example login u password netrc55",
    "BACKUP_TARGET": "backup:barepw55@10.0.0.5:/srv/backups",
}
SECRETS_55 = ["jsonpw55", "jsonkey55", "authtoken55", "xapikey55", "sshpass55", "mysqlpw55", "netrc55", "barepw55",
              "argvsshpass55", "argvmysql55", "shline55"]
INNOCENT_55 = {
    "SERVE_CMD": "python -m http.server -p 8080",
    "SSH_TARGET": "deploy@gpu-node-7",
    "NOTE": "reset the password in the vault, then retry",
    "PORTS": "docker run -p 8080:80 img",
    "IMAGE": "python:3.11@sha256:0123456789abcdef0123456789abcdef",
    "HEADERS": "Accept: application/json",
}


def test_the_eight_shapes_of_issue_55_show_nowhere_in_check_and_innocent_text_stays(bin_dir, tmp_path):
    """Before: `check` printed every secret of SHAPES_55 (JSON members, two headers, sshpass -p, mysql -pX, a .netrc
    line, user:pass@host) and of the command line. Now: hidden in `check` and `check --json`, each shape still
    recognisable (`"password": "***"`, `Token ***`, `-p***`); the innocent values are shown as they are."""
    env_lines = "\n".join(f"        {k} = {json.dumps(v)}" for k, v in {**SHAPES_55, **INNOCENT_55}.items())
    command = ["sh", "-c", "sshpass -p shline55 rsync -a d/ h:/d; true", "sshpass", "-p", "argvsshpass55",
               "mysql", "-uroot", "-pargvmysql55", "-p", "8080"]
    config = write_config(tmp_path, f"""
        [[role]]
        name = "p"
        cpu = 1
        command = {json.dumps(command)}
        [role.env]
{env_lines}
        """)
    shown = ""
    for args in ([], ["--json"]):
        c = run([bin_dir / "dflash-launch", "check", config, *args])
        assert c.returncode == 0, c.stderr
        shown += c.stdout + c.stderr
    for s in SECRETS_55:
        assert s not in shown, f"{s!r} shown by check:\n{shown}"
    for k, v in INNOCENT_55.items():
        assert f"{k}={v}" in shown, f"{k}={v} changed by check:\n{shown}"
    for hidden in ('"password": "***"', '"api_key": "***"', "Authorization: Token ***", "X-Api-Key: ***",
                   "sshpass -p *** scp", "-u root -p*** train", "login u password ***", "backup:***@10.0.0.5"):
        assert hidden in shown, f"{hidden!r} not in check:\n{shown}"
