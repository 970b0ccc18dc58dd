"""advise's flag lines pass Megatron-LM's own argument validation (megatron-core 0.19.2:
megatron.training.arguments parse_args + validate_args, then the TransformerConfig checks), run in
the Megatron-LM interpreter: $ZEPPELIN_MLM_PYTHON, default .venv-mlm/bin/python (scripts/setup.sh).
Skipped when that interpreter is absent. A line with ``--recompute-granularity full`` alone must fail."""

import dataclasses
import json
import os
import shlex
import subprocess

import pytest

from megatron_zeppelin.advise.recommend import advise
from megatron_zeppelin.advise.megatron_line import DATA_FLAGS, launch_env, megatron_flags
from megatron_zeppelin.spec.recompute import ADVISE_LEVELS, Recompute
from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.spec.hardware import load_profile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MLM = os.environ.get("ZEPPELIN_MLM_PYTHON", os.path.join(ROOT, ".venv-mlm", "bin", "python"))
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mlm_validate_flags.py")
NO_TE = ["--no-rope-fusion"]  # Transformer Engine (Megatron's default fused RoPE) cannot install on CPU

# slow: minutes on a loaded 2-core machine (Megatron-LM's import, four advise searches); run with -m slow
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.path.exists(MLM), reason=f"no Megatron-LM interpreter at {MLM} (megatron-core "
                                 "0.19.2 with megatron/training; set ZEPPELIN_MLM_PYTHON or run scripts/setup.sh)")]


def _validate(jobs):
    """[(flags, candidate, world, gpu arch)] -> one result dict each, from one Megatron interpreter."""
    payload = [{"flags": f + NO_TE, "env": dict(WORLD_SIZE=str(w), RANK="0", LOCAL_RANK="0", GPU_ARCH=str(arch),
                                                  **launch_env(c))} for f, c, w, arch in jobs]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([MLM, SCRIPT], input=json.dumps(payload), env=env, capture_output=True, text=True, timeout=900)
    results = [json.loads(ln[7:]) for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert len(results) == len(jobs), r.stderr[-3000:]
    return results


def test_advised_lines_pass_megatron_validation():
    jobs = []
    for model, cluster, nodes, seq in (("llama-13b", "a800", 1, 8192), ("llama-7b", "h200", 4, 8192)):
        m, p = load_model(model), load_profile(cluster)
        lengths = [seq] * (32 * nodes)
        a = advise(lengths, m, p, nodes, p.memory_GB * 1e9, seq_length=seq, use_sim=False)
        picks = [a.best] + [dataclasses.replace(a.best, recompute=lv) for lv in ADVISE_LEVELS if lv != a.best.recompute]
        picks += [next(c for c in a.candidates if c.zero_stage == z and c.fits) for z in range(4)
                  if any(c.zero_stage == z and c.fits for c in a.candidates)]
        picks += [c for c in a.candidates if c.strategy == "zeppelin" and c.tp > 1][:1]
        for c in picks:
            flags = megatron_flags(c, m, seq, sum(lengths), cluster, p.gpus_per_node, p.nics_per_node) + DATA_FLAGS
            jobs.append((flags, c, nodes * p.gpus_per_node, 8 if cluster == "a800" else 9))
    for (flags, c, _, _), r in zip(jobs, _validate(jobs)):
        assert r["ok"], (shlex.join(flags), r["error"], r.get("trace"))
        assert r["dp"] == c.dp and r["distopt"] == (c.zero_stage >= 1)
        assert (r["recompute"] or "none") == c.recompute.granularity


def test_full_recompute_alone_is_rejected_by_megatron():
    m = load_model("llama-7b")
    a = advise([8192] * 32, m, load_profile("a800"), 1, 80e9, seq_length=8192, use_sim=False)
    c = dataclasses.replace(a.best, recompute=Recompute("full"))
    flags = megatron_flags(c, m, 8192, 8192 * 32) + DATA_FLAGS
    i = flags.index("--recompute-method")
    (good, bad) = _validate([(flags, c, 8, 8), (flags[:i] + flags[i + 4:], c, 8, 8)])
    assert good["ok"], good
    assert not bad["ok"] and "recompute_method" in bad["error"]
