"""Server-side latency of one route from sandbot's JSON access log.

Usage: python3 latency.py LOGFILE ROUTE_SUBSTRING
Prints count, p50, p90, p99, max in microseconds (the "duration" field is ns).
"""
import json
import sys

path, route = sys.argv[1], sys.argv[2]
ds = []
with open(path) as f:
    for line in f:
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("msg") == "request" and route in r.get("route", "") and r.get("status") == 200:
            ds.append(r["duration"] / 1000.0)
ds.sort()
if not ds:
    print("no samples")
    sys.exit(1)
q = lambda p: ds[min(len(ds) - 1, int(p * len(ds)))]
print(f"server-side n={len(ds)} p50={q(0.50):.1f}us p90={q(0.90):.1f}us p99={q(0.99):.1f}us max={ds[-1]:.1f}us")
