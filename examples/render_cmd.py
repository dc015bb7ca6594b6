"""Seed 002 as a command handler: `jobcoord worker --exec render='python
examples/render_cmd.py'`. Earlier checkpoints arrive in JOBCOORD_CHECKPOINTS_FILE; a new one is
saved by running `jobcoord checkpoint` with the job id, worker and epoch from the environment
(JOBCOORD_URL names the database)."""

import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from examples import remote_service

payload = json.load(sys.stdin)
remote = payload["remote_dir"]
with open(os.environ["JOBCOORD_CHECKPOINTS_FILE"], encoding="utf-8") as f:
    saved = json.load(f).get("remote_submitted")
if saved is None:
    remote_id = remote_service.submit(remote, {"prompt": payload.get("prompt")})
    subprocess.run(
        [sys.executable, "-m", "jobcoord", "checkpoint", os.environ["JOBCOORD_JOB_ID"],
         "--worker", os.environ["JOBCOORD_WORKER"], "--epoch", os.environ["JOBCOORD_EPOCH"],
         "--name", "remote_submitted", "--data", json.dumps({"remote_id": remote_id})],
        check=True, stdout=subprocess.DEVNULL)
    resumed = False
else:
    remote_id, resumed = saved["remote_id"], True
while True:
    state = remote_service.status(remote, remote_id)
    if state["state"] == "done":
        print(json.dumps({"remote_id": remote_id, "output": state["output"],
                          "resumed": resumed}))
        sys.exit(0)
    time.sleep(0.05)
