from freezegun import freeze_time


def test_enqueue_claim_complete_round_trip(coord, cli):
    with freeze_time("2026-01-01 00:00:00"):
        job = coord.enqueue("summarize", {"doc": 1}, priority="P0", role="gpu")
        coord.heartbeat("w1", roles=["gpu"], readings={"memory_used_pct": 10})
        got = coord.claim("w1")
        assert got["job"]["job_id"] == job["job_id"]
        r = cli("complete", str(job["job_id"]), "--worker", "w1", "--epoch", "1",
                "--result", '{"ok": true}', "--json")
        assert r.code == 0, r.err
        assert coord.show(job["job_id"])["job"]["result"] == {"ok": True}
