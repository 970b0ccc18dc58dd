"""Every kind of line ``zeppelin advise`` prints runs: Megatron-LM's own parse_args + validate_args
(and the TransformerConfig built from them) accept it, and a Zeppelin line also passes the plugin's
validation (scripts/slurm/check_megatron_args.py, in the Megatron-LM python), with the data
placeholder replaced by a real indexed dataset. The kinds: Zeppelin (at the context and at a per-rank
share below it), packed DP (stock, and with whole documents through the Zeppelin entry), Megatron
CP of each size, DDP, the distributed optimizer, Megatron-FSDP ZeRO-2/3, each recompute level,
TP with sequence parallelism. (Issue 56 item 2: before, a Zeppelin line lacked --no-rope-fusion and
--calculate-per-token-loss, and its --mock-data was refused.)"""

import functools

import pytest

from megatron_zeppelin.advise.megatron_line import command_line
from megatron_zeppelin.advise.recommend import advise
from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.spec.model import load_model

from megatron_lines import check_jobs, job_from_line
from slurm_helpers import mlm_python_missing, write_documents

pytestmark = pytest.mark.slurm

# (model, cluster, nodes, context, TP sizes, batch lengths): a short context on one node (every ZeRO
# stage and recompute fits somewhere), and issue 56's case, 1M tokens of a 64K context on 4 nodes.
SEARCHES = (("llama-7b", "a800", 1, 8192, None, [8192] * 8 + [2048] * 32 + [1024] * 64),
            ("llama-7b", "h200", 4, 65536, [1, 2], [65536] + [2048] * 480))


def kind(c, context) -> tuple:
    """The layout part of what makes a printed line different in kind."""
    entry = getattr(c, "zeppelin_entry", c.strategy in ("zeppelin", "hybrid_dp"))
    below = (getattr(c, "share", 0) or context) < context
    return (c.strategy, entry, below, c.cp)


@functools.lru_cache(maxsize=None)
def advised_lines():
    """{(cluster, strategy, Zeppelin entry, share below the context, CP): [(line, GPU arch)]}: every
    layout advise weighs, each with enough of its candidates to print every ZeRO stage, recompute
    level and TP (> 1 or not) it weighs with that layout."""
    lines = {}
    for model, cluster, nodes, context, tps, lengths in SEARCHES:
        m, p = load_model(model), load_profile(cluster)
        a = advise(lengths, m, p, nodes, p.memory_GB * 1e9, seq_length=context, tps=tps, use_sim=False)
        seen = {}
        for c in [a.best] + a.candidates:
            k = (cluster,) + kind(c, context)
            new = {("zero", c.zero_stage), ("recompute", c.recompute.granularity), ("tp", c.tp > 1)} - seen.get(k, set())
            if new:
                seen.setdefault(k, set()).update(new)
                line = command_line(c, m, nodes, p.gpus_per_node, context, sum(lengths), cluster, p.nics_per_node)
                lines.setdefault(k, []).append((line, 8 if cluster == "a800" else 9))
    return lines


def test_every_advised_line_passes_megatron_and_the_plugin(tmp_path):
    why = mlm_python_missing()
    if why:
        pytest.skip(why)
    prefix = write_documents(str(tmp_path / "data" / "docs"))
    lines = advised_lines()
    every = [x for v in lines.values() for x in v]
    jobs = [job_from_line(line, f"advise{i}", prefix, arch) for i, (line, arch) in enumerate(every)]
    results = check_jobs(jobs, tmp_path)
    failed = {j["line"]: results[f"{j['name']}-{j['mode']}"]["error"] for j in jobs
              if not results[f"{j['name']}-{j['mode']}"]["ok"]}
    assert not failed, "\n".join(f"{e}\n  {line}" for line, e in failed.items())
    # ... and every kind the brief names was among them
    kinds = {k[1:] for k in lines}
    assert any(k[0] == "zeppelin" and k[2] for k in kinds) and any(k[0] == "zeppelin" and not k[2] for k in kinds)
    assert any(k[0] == "packed_dp" and not k[1] for k in kinds) and any(k[0] == "packed_dp" and k[1] for k in kinds)
    assert {k[3] for k in kinds if k[0] == "static_cp"} >= {2, 4, 8}
    assert all(any(f" {flag} " in line for line, _ in every) for flag in (
        "--overlap-grad-reduce", "--use-distributed-optimizer", "optim_grads", "optim_grads_params",
        "--recompute-granularity selective", "--recompute-granularity full", "--sequence-parallel"))


def test_the_check_fails_a_zeppelin_line_without_what_it_needs(tmp_path):
    """The check can fail: the Zeppelin line without --no-rope-fusion, or --calculate-per-token-loss."""
    why = mlm_python_missing()
    if why:
        pytest.skip(why)
    prefix = write_documents(str(tmp_path / "data" / "docs"))
    line = next(line for v in advised_lines().values() for line, _ in v if "--zeppelin-balance" in line)
    jobs = [job_from_line(line.replace(f" {flag}", ""), f"without{i}", prefix)
            for i, flag in enumerate(("--no-rope-fusion", "--calculate-per-token-loss"))]
    results = check_jobs(jobs, tmp_path)
    assert "--no-rope-fusion" in results["without0-zeppelin"]["error"]
    assert "--calculate-per-token-loss" in results["without1-zeppelin"]["error"]
