#!/usr/bin/env python3
"""Checks deploy/grafana/ballast.json (the ctest grafana_dashboard runs it).

  check-dashboard.py static DASHBOARD SCHEMA METRICS_CC ALERTS_YAML WORK_DIR
      The dashboard against Grafana's documented JSON model (SCHEMA, with
      python3-jsonschema), then what a schema cannot say: unique panel ids,
      panels inside the 24-column grid and not overlapping, every query on
      the ${datasource} variable with a refId, every $variable defined,
      every metric a family the daemon exports (METRICS_CC, where all are
      built) or a rule of ALERTS_YAML, and every query valid PromQL
      (promtool check rules on a rules file made of them).
  check-dashboard.py live DASHBOARD PROMETHEUS_URL
      Every query, run by a real Prometheus scraping a serving daemon,
      succeeds and returns series (except the ones listed in MAY_BE_EMPTY,
      for events the test's workload does not cause).
Exits non-zero naming each problem.
"""
import json
import re
import subprocess
import sys
import urllib.parse
import urllib.request

# Queries whose series only exist after events the live test does not
# cause, with the reason.
MAY_BE_EMPTY = {
    "ballast_node_evictions_total": "no model is evicted in the test",
    "ballast_node_remap_layers": "remapping is off in the test",
    "ballast_node_kv_tier_bytes": "the test's node has no session KV tiers",
    "ballast_node_kv_hits_total": "counted for session turns with KV tiers only",
}


def queries(dash):
    for p in dash["panels"]:
        for sub in [p] + p.get("panels", []):
            for t in sub.get("targets", []):
                yield sub, t


def substitute(expr, rate_interval):
    expr = expr.replace("$__rate_interval", rate_interval)
    return re.sub(r"\$\{?model\}?", ".*", expr)


def fail(problems):
    for p in problems:
        print("check-dashboard:", p, file=sys.stderr)
    sys.exit(1 if problems else 0)


def check_layout(dash, problems):
    ids, cells, overlaps = set(), {}, set()
    for p in dash["panels"]:
        if "gridPos" not in p or "id" not in p:
            problems.append(f"panel {p.get('title')!r} has no id or gridPos")
            continue
        if p["id"] in ids:
            problems.append(f"panel id {p['id']} used twice")
        ids.add(p["id"])
        g = p["gridPos"]
        if g["x"] + g["w"] > 24:
            problems.append(f"panel {p['id']} ({p.get('title')}) runs past column 24")
        for x in range(g["x"], min(24, g["x"] + g["w"])):
            for y in range(g["y"], g["y"] + g["h"]):
                if (x, y) in cells and (cells[(x, y)], p["id"]) not in overlaps:
                    overlaps.add((cells[(x, y)], p["id"]))
                    problems.append(f"panels {cells[(x, y)]} and {p['id']} overlap at {x},{y}")
                cells[(x, y)] = p["id"]


def check_queries(dash, families, rules, problems):
    variables = {v["name"] for v in dash["templating"]["list"]} | {"__rate_interval"}
    for panel, t in queries(dash):
        where = f"panel {panel['id']} ({panel.get('title')}) query {t.get('refId')}"
        if not t.get("refId"):
            problems.append(f"{where}: no refId")
        if t.get("datasource", panel.get("datasource")) != {"type": "prometheus",
                                                            "uid": "${datasource}"}:
            problems.append(f"{where}: not on the ${{datasource}} variable")
        for var in re.findall(r"\$\{?(\w+)", t["expr"]):
            if var not in variables:
                problems.append(f"{where}: ${var} is not a dashboard variable")
        for name in set(re.findall(r"\b(ballast[_:][a-z0-9_:]+)", t["expr"])):
            base = re.sub(r"_(bucket|count|sum)$", "", name)
            if base not in families and name not in rules:
                problems.append(f"{where}: {name} is neither an exported family nor a rule")


def promtool_check(dash, work, problems):
    lines = ["groups:", "  - name: dashboard", "    rules:"]
    for i, (_, t) in enumerate(queries(dash)):
        lines.append(f"      - record: dashboard:query{i}")
        lines.append("        expr: " + json.dumps(substitute(t["expr"], "1m")))
    path = f"{work}/dashboard-rules.yaml"
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    r = subprocess.run(["promtool", "check", "rules", path], capture_output=True, text=True)
    if r.returncode != 0:
        problems.append("promtool check rules on the dashboard's queries:\n" + r.stdout + r.stderr)


def static(dash_path, schema_path, metrics_cc, alerts, work):
    import jsonschema
    dash = json.load(open(dash_path))
    schema = json.load(open(schema_path))
    jsonschema.Draft7Validator.check_schema(schema)
    problems = [f"{dash_path}: {e.json_path}: {e.message}"
                for e in jsonschema.Draft7Validator(schema).iter_errors(dash)]
    if problems:
        fail(problems)
    families = set(re.findall(r'\.Name\("(ballast_[a-z0-9_]+)"\)', open(metrics_cc).read()))
    rules = set(re.findall(r"record:\s*(\S+)", open(alerts).read()))
    check_layout(dash, problems)
    check_queries(dash, families, rules, problems)
    promtool_check(dash, work, problems)
    n = sum(1 for _ in queries(dash))
    if not problems:
        print(f"check-dashboard: {len(dash['panels'])} panels, {n} queries: schema, layout, "
              f"variables, {len(families)} families and PromQL all valid")
    fail(problems)


def live(dash_path, url):
    dash = json.load(open(dash_path))
    problems, answered = [], 0
    for panel, t in queries(dash):
        expr = substitute(t["expr"], "30s")
        q = urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=10) as r:
            body = json.load(r)
        where = f"panel {panel['id']} ({panel.get('title')}) query {t['refId']}"
        if body.get("status") != "success":
            problems.append(f"{where}: {body.get('error')}")
        elif body["data"]["result"]:
            answered += 1
        elif not any(m in expr for m in MAY_BE_EMPTY):
            problems.append(f"{where}: no series for {expr}")
    if not problems:
        print(f"check-dashboard: {answered} queries returned series from the live daemon")
    fail(problems)


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "static":
        static(*sys.argv[2:])
    elif len(sys.argv) == 4 and sys.argv[1] == "live":
        live(*sys.argv[2:])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
