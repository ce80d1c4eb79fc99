#!/usr/bin/env python3
# Legacy INSERT (committed, synchronous_commit on) -> the clean document readable over REST,
# one row at a time (docs/BENCHMARKS.md, "Legacy capture"). Needs a meshql serving a mapping
# processor of the table cust_acct (key acct_id) into the entity customer, as
# scripts/bench-legacy-snapshot.sh sets up. Usage: bench-legacy-latency.py LEGACY_URL BASE_URL ROWS
import subprocess, sys, time, uuid, json, requests, statistics
url, base, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
NS = uuid.UUID("6fa4a995-5b3f-41d4-a4a1-13b2a525552a")
p = subprocess.Popen(["psql", url, "-qtA"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
p.stdin.write("SET synchronous_commit = on;\n"); p.stdin.flush()
s = requests.Session()
lat = []
for i in range(n):
    p.stdin.write(f"INSERT INTO cust_acct (acct_num, cust_nm_first, stat_cd, tot_amt) VALUES ('L-{i}', 'X', 'A', {i}) RETURNING acct_id;\n")
    p.stdin.flush()
    acct = p.stdout.readline().strip()
    t0 = time.perf_counter()
    doc = str(uuid.uuid5(NS, json.dumps(["cust_acct", acct], separators=(",", ":"))))
    while True:
        r = s.get(f"{base}/customer/api/{doc}")
        if r.status_code == 200:
            break
        time.sleep(0.0003)
    lat.append((time.perf_counter() - t0) * 1000)
    time.sleep(0.005)
lat.sort()
q = lambda f: lat[min(len(lat) - 1, int(f * len(lat)))]
print(f"{n} rows: p50 {q(0.5):.2f} ms, p95 {q(0.95):.2f} ms, p99 {q(0.99):.2f} ms, max {lat[-1]:.2f} ms")
