"""validation_probes/: every probe loads against today's package, and bench_validation_cpu prices a
plan's Posts and packing by the host the validation passes in (spec/host.py), not the profile."""

from bench_scripts import load_probe

from megatron_zeppelin.planner import plan_batch
from megatron_zeppelin.planner.testing import TOY_PROFILE
from megatron_zeppelin.spec.host import HostModel
from megatron_zeppelin.spec.topology import Topology
from megatron_zeppelin.validation.cpu_profile import CpuProfile

PROBES = ("bench_host_cores", "bench_host_drift", "bench_host_sharing", "bench_wake", "bench_validation_cpu")


def test_every_probe_loads():
    for name in PROBES:
        assert callable(load_probe(name).main)


def test_validation_cpu_model_terms_read_the_host():
    from megatron_zeppelin.validation.concurrent import CPU_MODEL
    probe = load_probe("bench_validation_cpu")
    topo = Topology(1, 2)
    plan = plan_batch([3000, 500, 200], topo, TOY_PROFILE, CPU_MODEL, strategy="static_cp")
    assert plan.rings  # a ring plan: it posts exchanges and packs its own rows
    bare = probe.model_terms(plan, CpuProfile(TOY_PROFILE, HostModel()), 2)
    host = probe.model_terms(plan, CpuProfile(TOY_PROFILE, HostModel(post_us=300.0, pack_GBps=1.0)), 2)
    assert bare[0] == host[0]  # the Computes' seconds do not depend on the engine's CPU
    posts = host[1] / 300e-6  # whole Posts at 300 us each
    assert bare[1] == 0.0 and posts >= 1 and abs(posts - round(posts)) < 1e-9
    assert bare[2] == [0.0, 0.0] and min(host[2]) > 0
