"""Two throughput measurements of the same settings compared: each median against the other
run's [min, max], and the ratio of medians per batch size.

    python docs/studies/demo-frontier/compare_runs.py throughput-run-a.json throughput-run-b.json
"""

import json, statistics, sys
a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2]))
def recs(d):
    d=d.get("result",d)
    return {(r["name"],r["batch_size"]):r for r in d["records"]}
ra,rb=recs(a),recs(b)
inside=0; ratios={1:[],32:[]}
for k in ra:
    x,y=ra[k]["tokens_per_s"],rb[k]["tokens_per_s"]
    ok = y["low"]<=x["median"]<=y["high"] and x["low"]<=y["median"]<=x["high"]
    inside+=ok; ratios[k[1]].append(y["median"]/x["median"])
    print(k, round(x["median"]), round(y["median"]), f"{y['median']/x['median']:.3f}", "within" if ok else "OUT")
print("each median within the other run's [min, max]:", inside, "/", len(ra))
for b_,r in ratios.items(): print("batch",b_,"ratio median %.3f min %.3f max %.3f"%(statistics.median(r),min(r),max(r)))
