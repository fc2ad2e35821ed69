#!/usr/bin/env python3
"""Per-executable test counts and times from a ctest log: `ctest_times.py LOG [REGEX]`.

Sums the seconds CTest printed for each test, grouped by test executable (the part of the test's name before the
first dot), for the executables whose name matches REGEX. Used for the control-plane test times in
docs/architecture.md ("Build and tooling").
"""
import re,sys,collections
t=collections.defaultdict(float); n=collections.Counter()
for line in open(sys.argv[1]):
    m=re.search(r'Test\s+#\d+: (\w+?)\..*? \.{3,}.*?([\d.]+) sec',line)
    if m:
        exe=m.group(1); t[exe]+=float(m.group(2)); n[exe]+=1
pat=sys.argv[2] if len(sys.argv)>2 else ''
tot=0;cnt=0
for k in sorted(t):
    if re.match(pat,k): print(f'{k:45s} {n[k]:4d} {t[k]:8.1f}'); tot+=t[k]; cnt+=n[k]
print('total',cnt,round(tot,1))
