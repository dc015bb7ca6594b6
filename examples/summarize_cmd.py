"""An example command handler: `jobcoord worker --exec summarize='python
examples/summarize_cmd.py'`. Payload JSON on stdin, result on stdout.

Payload switches for the tests: `fail` (exit 3 with a message on stderr: retried),
`bad` (exit 65: permanent), `background_pid_file` (leaves a child running), `sleep`
seconds (writes its pid to `pid_file` first, and a `<pid_file>.term` marker if it receives
SIGTERM), `huge` bytes of output, `echo_checkpoints` (reports the checkpoints it was given).
"""

import json
import os
import signal
import sys
import time

payload = json.load(sys.stdin)
if payload.get("pid_file"):
    with open(payload["pid_file"], "w") as f:
        f.write(str(os.getpid()))

    def _term(_signum, _frame):
        with open(payload["pid_file"] + ".term", "w") as f:
            f.write("SIGTERM")
        sys.exit(143)

    signal.signal(signal.SIGTERM, _term)
if payload.get("background_pid_file"):
    # A careless command: a child left running in the background, holding stdout open.
    import subprocess

    child = subprocess.Popen(["sleep", "60"])
    with open(payload["background_pid_file"], "w") as f:
        f.write(str(child.pid))
if payload.get("fail"):
    print("loading model weights...", file=sys.stderr)
    print(f"error: {payload['fail']}", file=sys.stderr)
    sys.exit(3)
if payload.get("bad"):
    print("payload has no text", file=sys.stderr)
    sys.exit(65)
time.sleep(float(payload.get("sleep", 0)))
if payload.get("echo_checkpoints"):
    with open(os.environ["JOBCOORD_CHECKPOINTS_FILE"], encoding="utf-8") as f:
        from_file = json.load(f)
    print(json.dumps({"names": sorted(from_file),
                      "sizes": {k: len(json.dumps(v)) for k, v in from_file.items()},
                      "in_env": "JOBCOORD_CHECKPOINTS" in os.environ,
                      "file": os.environ["JOBCOORD_CHECKPOINTS_FILE"]}))
    sys.exit(0)
words = str(payload.get("text", "")).split()
print(json.dumps({
    "jobcoord_envelope": 1,
    "result": {"summary": " ".join(words[:5]), "pad": "x" * int(payload.get("huge", 0)),
               "job": os.environ.get("JOBCOORD_JOB_ID")},
    "provenance": {"model": "cmd-summarizer", "model_version": "2.1",
                   "runtime": f"python {sys.version.split()[0]}"},
}))
