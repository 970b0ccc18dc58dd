"""70B: extra micro-batches of one document vs of up to `world` documents (each the fullest round's shortest)."""
import sys, os
import megatron_zeppelin.planner.accumulation as A
orig = A.round_indices
def patched(steps, cost, capacity, most=0):
    world = cost.topology.world_size
    k = len(steps)
    # run the original with a huge k to get the rounds unsplit
    fake = list(steps) + [[]] * 100000
    members = orig(steps, cost, capacity, most)
    return members
per = int(os.environ.get("PER", "1"))
src = open(A.__file__).read()
if per > 1:
    import types
    code = src.replace("""    while len(members) < len(steps):
        fullest = max(range(len(members)), key=lambda m: (len(members[m]), -m))
        shortest = min(members[fullest], key=lambda i: (docs[i], -i))
        members[fullest].remove(shortest)
        members.append([shortest])""", f"""    n0 = len(members)
    while len(members) < len(steps):
        new = []
        for _ in range({per}):
            fullest = max(range(n0), key=lambda m: (len(members[m]), -m))
            if len(members[fullest]) <= 1:
                break
            shortest = min(members[fullest], key=lambda i: (docs[i], -i))
            members[fullest].remove(shortest)
            new.append(shortest)
        members.append(sorted(new))""")
    assert code != src
    exec(compile(code, A.__file__, "exec"), A.__dict__)
sys.argv = [sys.argv[0]] + sys.argv[1:]
exec(open(__file__.replace("singles.py", "fill3.py")).read())
