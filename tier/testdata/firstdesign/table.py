# Prints the table of run.sh from its log: per benchmark, keys a second of both, now ÷ first design.
import re,sys,statistics as st,collections
rows=collections.defaultdict(lambda: collections.defaultdict(dict))  # name -> round -> ver -> (keys/s,cpu)
r=None
for line in open(sys.argv[1]):
    m=re.match(r'== round (\d+) (\w+)',line)
    if m: r=int(m.group(1)); continue
    m=re.match(r'(old|new) (Benchmark\S+)-2\s.*?([\d.]+) cpu-ns/key\s+([\d.]+) keys/s',line)
    if m: rows[m.group(2)][r][m.group(1)]=(float(m.group(4)),float(m.group(3)))
def fmt(x): return f"{x/1e6:.2f} M" if x>=1e6 else (f"{x/1e3:.0f} k" if x>=1e4 else f"{x/1e3:.2f} k")
print("| benchmark | first design keys/s | now keys/s | now ÷ first (median, range) | CPU a key now ÷ first |")
print("|---|---|---|---|---|")
for name,rs in rows.items():
    rat=[];cr=[];o=[];n=[]
    for rr,v in sorted(rs.items()):
        if 'old' in v and 'new' in v:
            rat.append(v['new'][0]/v['old'][0]); cr.append(v['new'][1]/v['old'][1]); o.append(v['old'][0]); n.append(v['new'][0])
    if not rat: print(name,"incomplete"); continue
    short=name.replace("BenchmarkCmp","")
    print(f"| {short} | {fmt(min(o))}–{fmt(max(o))} | {fmt(min(n))}–{fmt(max(n))} | **{st.median(rat):.2f}** ({min(rat):.2f}–{max(rat):.2f}) | {st.median(cr):.2f} |")
