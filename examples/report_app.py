"""Artifacts from a Python handler: `jobcoord worker --app examples.report_app:app` (run from
the repository root, on a database migrated `--with artifacts`). The handler renders a small
report and stages it with `ctx.artifact`; it becomes part of the result when the completion is
accepted."""

from __future__ import annotations

from jobcoord.app import App, Context

app = App()


@app.handler("report", timeout=60)
def report(payload: dict, ctx: Context) -> dict:
    title = str(payload.get("title", "report"))
    body = f"# {title}\n\njob {ctx.job_id}, attempt {ctx.attempt}\n".encode()
    staged = ctx.artifact("report.md", body, media_type="text/markdown")
    return {"title": title, "artifact": staged["digest"]}
