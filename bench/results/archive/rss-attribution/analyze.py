import json, re, statistics, sys, glob, os, collections
d = sys.argv[1] if len(sys.argv) > 1 else "/work/rss/results"
res = json.load(open(os.path.join(d, "results.json")))
def smaps_break(path, label):
    agg = collections.Counter(); cur = None
    for line in open(path):
        m = re.match(r'^[0-9a-f]+-[0-9a-f]+ (\S+) \S+ \S+ \S+\s*(.*)$', line)
        if m:
            name = m.group(2)
            if "candidate-" in name: cur = "bin"
            elif name.startswith("/"): cur = "libs"
            elif name == "[heap]": cur = "heap"
            elif name == "[stack]": cur = "stack"
            elif name == "": cur = "anon"
            else: cur = name
            continue
        if line.startswith("Rss:"): agg[cur] += int(line.split()[1])
        if line.startswith("Anonymous:"): agg[cur + "_anon"] += int(line.split()[1])
    return agg
rows = collections.defaultdict(list)
for r in res:
    sm = smaps_break(os.path.join(d, f"{r['label']}-t{r['trial']}-{r['role']}.smaps"), r['label'])
    ro = r["rollup"]
    rows[(r["label"], r["role"])].append(dict(VmRSS=r["VmRSS"], Anon=ro["Anonymous"], File=ro["Rss"] - ro["Anonymous"],
        RssFile=r.get("RssFile"), bin_file=sm["bin"] - sm["bin_anon"], bin_anon=sm["bin_anon"], libs_file=sm["libs"] - sm["libs_anon"], libs_anon=sm["libs_anon"], heap=sm["heap"], anon_maps=sm["anon"], stack=sm["stack"], Threads=r["Threads"], HWM=r["VmHWM"]))
keys = ["VmRSS", "Anon", "File", "bin_file", "bin_anon", "libs_file", "libs_anon", "heap", "anon_maps", "stack", "Threads", "HWM"]
print("%-18s %-22s %2s " % ("label", "role", "n") + " ".join("%9s" % k for k in keys) + "   (medians, KiB; VmRSS per trial)")
order = []
for r in res:
    if r["label"] not in order: order.append(r["label"])
for role in ("leader", "follower", "leader-with-followers"):
    for label in order:
        v = rows.get((label, role))
        if not v: continue
        print("%-18s %-22s %2d " % (label, role, len(v)) + " ".join("%9d" % statistics.median([x[k] for x in v]) for k in keys), "  ", [x["VmRSS"] for x in v])
