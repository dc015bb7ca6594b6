"""Artifacts from a command handler: `jobcoord worker --exec report='python
examples/report_cmd.py'`. Every regular file the command leaves in $JOBCOORD_ARTIFACTS_OUT is
stored and linked to the result when the attempt completes (the name is the file's name)."""

import json
import os
import sys

payload = json.load(sys.stdin)
out = os.environ["JOBCOORD_ARTIFACTS_OUT"]
title = str(payload.get("title", "report"))
with open(os.path.join(out, "report.md"), "w", encoding="utf-8") as f:
    f.write(f"# {title}\n\nrendered by a command for job {os.environ['JOBCOORD_JOB_ID']}\n")
print(json.dumps({"title": title}))
