"""Reads wrk --latency output on stdin; prints "p50_us p99_us requests_per_s"."""
import re
import sys

UNITS = {"us": 1.0, "ms": 1e3, "s": 1e6}
out = sys.stdin.read()


def pct(p):
    m = re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
    return float(m.group(1)) * UNITS[m.group(2)]


rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
if re.search(r"Non-2xx", out):
    sys.exit("non-2xx answers:\n" + out)
print(f"{pct(50):.1f} {pct(99):.1f} {rps:.1f}")
