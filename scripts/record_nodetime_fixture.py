"""Record tests/fixtures/nodetime/: a real perf script (frame pointers, symbol offsets) of
a vanilla backend running nested_loop's Query-1 at scale 0.02, the plan of that query, and
what the attribution made of it then (the pure tests check the attribution still agrees).

    PROFKIT_PG19_SOURCE=... .venv/bin/python scripts/record_nodetime_fixture.py

Keeps the first KEEP samples of the backend's recording (gzip), enough for the tests and
small enough to commit.
"""
from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

from profkit.experiments.nodetime import nodetime_on_conn
from profkit.pg.build import get_build
from profkit.pg.cluster import Cluster
from profkit.pg.workloads import get_workload

KEEP = 400
OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "nodetime"
QUERY1 = "SELECT count(*) FROM test1 AS a, test2 AS b, test3 AS c WHERE a.id = c.id"


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    b = get_build("vanilla", progress=print)
    with Cluster(b, name="nodetime-fixture") as cl, cl.connect() as conn:
        get_workload("nested_loop").load(conn, 0.02)
        res = nodetime_on_conn(conn, QUERY1, min_samples=KEEP, max_seconds=20,
                               progress=print)
    text = (res.run.path / "perf.script.txt").read_text(errors="surrogateescape")
    samples = text.split("\n\n")[:KEEP]
    with gzip.open(OUT / "query1.perf-script.txt.gz", "wt", compresslevel=9) as f:
        f.write("\n\n".join(samples).rstrip("\n") + "\n\n")
    (OUT / "query1.plan.json").write_text((res.run.path / "plan.json").read_text())
    (OUT / "query1.recorded.json").write_text(json.dumps({
        "build": b.name, "run_id": res.run.run_id, "kept_samples": len(samples),
        "postgres": str(b.postgres), "script_fields": "comm,pid,tid,time,event,ip,sym,"
        "symoff,dso --no-inline", "pid": res.facts["pid"]}, indent=1))
    print(res.console())
    return 0


if __name__ == "__main__":
    sys.exit(main())
