"""Records of the old and new trees equal (timing fields aside), and each side's time."""
import glob
import json
import os
import sys

from compare_regen import strip  # the records' fields but their timing

out = sys.argv[1]
rows, same_all = [], True
for new in sorted(glob.glob(os.path.join(out, "new_*.json"))):
    old = new.replace("new_", "old_")
    a, b = json.load(open(old)), json.load(open(new))
    same = strip(a["records"]) == strip(b["records"])
    same_all &= same
    rows.append({"key": b["key"], "old_cpu_s": a["cpu_s"], "new_cpu_s": b["cpu_s"], "old_wall_s": a["wall_s"],
                 "new_wall_s": b["wall_s"], "records_equal": same})
    print(f"{b['key']}: old {a['cpu_s']:.1f} s CPU, new {b['cpu_s']:.1f} s ({a['cpu_s'] / b['cpu_s']:.2f}x); "
          f"records equal: {same}")
tot_old, tot_new = sum(r["old_cpu_s"] for r in rows), sum(r["new_cpu_s"] for r in rows)
print(f"total: old {tot_old:.1f} s CPU, new {tot_new:.1f} s ({tot_old / tot_new:.2f}x); every record equal: {same_all}")
json.dump({"configs": rows, "old_cpu_s": tot_old, "new_cpu_s": tot_new, "records_equal": same_all},
          open(os.path.join(out, "summary.json"), "w"), indent=1)
