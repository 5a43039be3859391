import subprocess, sys, re, collections
def crate_of(name):
    # demangled rust: crate::path::..., or <T as crate::Trait>::f ; take the first path segment
    n = name.lstrip('<&*_ ')
    n = re.sub(r'^(dyn |mut |const )', '', n)
    m = re.match(r'([A-Za-z_][A-Za-z0-9_]*)::', n)
    return m.group(1) if m else '?' + (n[:0])
res = {}
for b in sys.argv[1:]:
    out = subprocess.run(["nm", "-S", "--size-sort", "-C", "-t", "d", b], capture_output=True, text=True).stdout
    agg = collections.Counter()
    for line in out.splitlines():
        parts = line.split(None, 3)
        if len(parts) < 4 or parts[2] not in "tTwW": continue
        agg[crate_of(parts[3])] += int(parts[1])
    res[b] = agg
keys = set().union(*[set(a) for a in res.values()])
rows = sorted(keys, key=lambda k: -max(res[b][k] for b in res))
print("%-28s" % "crate" + "".join("%14s" % b[-7:] for b in res))
for k in rows[:40]:
    print("%-28s" % k + "".join("%14d" % res[b][k] for b in res))
print("%-28s" % "TOTAL" + "".join("%14d" % sum(res[b].values()) for b in res))
