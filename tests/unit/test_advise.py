"""zeppelin advise: the global batch is fixed (micro-batch size and accumulation are the free
choices), per-micro-batch ZeRO-2/3 communication, the distributed optimizer by default, a complete
and self-consistent Megatron flag line, and model-state memory checked against DeepSpeed's
estimators."""

import pytest

from megatron_zeppelin.advise.recommend import AdviseError, advise, comm_exposed_s, parse_memory, split_micro_batches
from megatron_zeppelin.advise.megatron_line import check_consistency, command_line, megatron_flags
from megatron_zeppelin.cli import main
from megatron_zeppelin.spec.memory import predict_memory
from megatron_zeppelin.spec.recompute import ADVISE_LEVELS, Recompute
from megatron_zeppelin.spec.model import load_model
from megatron_zeppelin.spec.hardware import load_profile
from megatron_zeppelin.spec.entries import PACKED_ENTRY, ZEPPELIN_ENTRY

SEQ = 8192
BATCH = [8192] * 16 + [4096] * 32  # 256K tokens = 32 sequences of 8K


# DeepSpeed's model-state estimators without offload, transcribed from deepspeed/runtime/zero/
# stage_1_and_2.py (estimate_zero2_model_states_mem_needs, cpu_offload=False) and stage3.py
# (estimate_zero3_model_states_mem_needs, cpu_offload=False); https://deepspeed.readthedocs.io/en/latest/memory.html
def ds_zero2_gpu_bytes(total_params, total_gpus):
    return 4 * total_params + int(16 * total_params / total_gpus)


def ds_zero3_gpu_bytes(total_params, largest_layer_params, total_gpus):
    return 4 * largest_layer_params + int(18 * total_params / total_gpus)


@pytest.fixture(scope="module")
def a13():
    return advise(BATCH, load_model("llama-13b"), load_profile("a800"), 1, 80e9, seq_length=SEQ, use_sim=False)


def test_global_batch_is_fixed_and_micro_batch_is_free(a13):
    assert all(c.dp * c.mbs * c.ga * (c.share or SEQ) == sum(BATCH) for c in a13.candidates)
    assert all(c.dp * c.cp * c.tp == 8 for c in a13.candidates)
    assert len({(c.mbs, c.ga) for c in a13.candidates}) > 2  # several micro-batch sizes were weighed
    assert split_micro_batches(BATCH, 4) and sum(map(sum, split_micro_batches(BATCH, 4))) == sum(BATCH)


def test_pick_fits_and_is_fastest_within_tolerance(a13):
    b = a13.best
    assert b is not None and b.fits
    assert b.iteration_s <= 1.03 * min(c.iteration_s for c in a13.candidates if c.fits)


def test_flag_line_is_complete_and_consistent(a13):
    m = load_model("llama-13b")
    for c in [a13.best] + [c for c in a13.candidates if not c.recompute.none][:40:7]:
        flags = megatron_flags(c, m, SEQ, sum(BATCH), "a800", 8, 4)
        assert check_consistency(flags, c, m, world=8, seq_length=SEQ, global_batch_tokens=sum(BATCH)) == []
        if c.recompute.full:  # issue 18 item 7: never "--recompute-granularity full" alone
            assert flags[flags.index("--recompute-granularity"):][:6] == [
                "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    line = command_line(a13.best, m, 1, 8, SEQ, sum(BATCH), "a800", 4)
    assert line.startswith(("torchrun", "CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun")) and "--global-batch-size 32" in line


def test_line_runs_an_entry_the_package_ships(a13):
    """The launcher runs a module of the package (a wheel install has it), never a checkout's script."""
    import dataclasses
    import importlib.util
    m = load_model("llama-13b")
    for strategy, entry in (("zeppelin", ZEPPELIN_ENTRY), ("hybrid_dp", ZEPPELIN_ENTRY), ("packed_dp", PACKED_ENTRY)):
        c = dataclasses.replace(a13.best, strategy=strategy)
        line = command_line(c, m, 1, 8, SEQ, sum(BATCH), "a800", 4)
        assert f"--nproc-per-node 8 -m {entry} --num-layers" in line, line
        assert importlib.util.find_spec(entry) is not None and ".py" not in line.split(" --num-layers")[0]


def test_consistency_check_catches_incomplete_recompute(a13):
    import dataclasses
    m = load_model("llama-13b")
    c = dataclasses.replace(a13.best, recompute=Recompute("full"))
    flags = megatron_flags(c, m, SEQ, sum(BATCH))
    i = flags.index("--recompute-method")
    bad_line = flags[:i] + flags[i + 4:]  # "--recompute-granularity full" alone (issue 18 item 7)
    assert check_consistency(flags, c, m, 8, SEQ, sum(BATCH)) == []
    assert any("--recompute-method" in p for p in check_consistency(bad_line, c, m, 8, SEQ, sum(BATCH)))


def test_distributed_optimizer_by_default_when_not_slower(a13):
    for c in a13.candidates:
        if c.zero_stage == 0:
            z1 = next(d for d in a13.candidates if d.zero_stage == 1 and (d.tp, d.cp, d.strategy, d.mbs, d.recompute)
                      == (c.tp, c.cp, c.strategy, c.mbs, c.recompute))
            assert z1.iteration_s <= c.iteration_s + 1e-9
            assert z1.memory.total < c.memory.total if c.dp * c.cp > 1 else z1.memory.total == c.memory.total
    assert a13.best.zero_stage != 0


def test_zero3_and_zero2_communicate_per_micro_batch():
    one = comm_exposed_s(3, 1, fwd_s=0.1, bwd_s=0.2, layers=4, ar_grad_s=1.0, ar_param_s=0.5)
    assert comm_exposed_s(3, 4, 0.1, 0.2, 4, 1.0, 0.5) == pytest.approx(4 * one)
    z1 = [comm_exposed_s(1, ga, 0.1, 0.2, 4, 1.0, 0.5) for ga in (1, 4)]
    assert z1[0] == z1[1]  # ZeRO-1 / DDP reduce once per step, whatever the accumulation
    assert comm_exposed_s(2, 4, 0.1, 0.2, 4, 1.0, 0.5) > comm_exposed_s(2, 1, 0.1, 0.2, 4, 1.0, 0.5)


@pytest.mark.parametrize("name", ["llama-3b", "llama-7b", "llama-13b", "llama-30b"])
def test_model_states_against_deepspeed_estimators(name):
    """Our per-GPU model states vs DeepSpeed's: ZeRO-2 differs by exactly the full 16-bit gradient
    DeepSpeed keeps (2 bytes x P) and Megatron-FSDP's optim_grads does not; ZeRO-3 by the gathered
    unit only (the sharded states are the same 18 bytes per parameter / N; DeepSpeed adds 4 bytes x its
    largest module, advise two prefetched bf16 transformer layers)."""
    m = load_model(name)
    P = m.params()
    for n in (8, 32):
        z2 = predict_memory(m, 0, dp=n, zero_stage=2)
        assert ds_zero2_gpu_bytes(P, n) - (z2.weights + z2.gradients + z2.optimizer) == pytest.approx(2 * P, rel=1e-6)
        z3 = predict_memory(m, 0, dp=n, zero_stage=3)
        assert (z3.weights + z3.gradients + z3.optimizer) == pytest.approx(18 * P / n, rel=1e-6)  # the same 18 bytes/param/N
        largest = max(m.vocab * m.hidden, m.hidden * m.ffn)  # DeepSpeed's largest module (embedding or fc)
        assert ds_zero3_gpu_bytes(P, largest, n) > (z3.weights + z3.gradients + z3.optimizer)


def test_picks_fit_by_deepspeed_estimators_too(a13):
    """The pick's model states by DeepSpeed's formula (ZeRO-1 and -2 share DeepSpeed's stage-1/2
    estimator) plus our activations stay within the GPU: advise does not rely on an optimistic count."""
    m, b = load_model("llama-13b"), a13.best
    shards, P = 8 // b.tp, m.params() / b.tp
    ds = (ds_zero3_gpu_bytes(P, max(m.vocab * m.hidden, m.hidden * m.ffn) / b.tp, shards) if b.zero_stage == 3
          else ds_zero2_gpu_bytes(P, shards))
    if b.zero_stage == 1:
        assert b.memory.total - b.memory.activations >= ds  # Megatron's fp32 main grads: more than DeepSpeed's
    assert ds + b.memory.activations <= 80e9


def test_nothing_fits_says_so():
    a = advise([8192] * 8, load_model("llama-30b"), load_profile("a800"), 1, 16e9, seq_length=SEQ, use_sim=False)
    assert a.best is None and "add --nodes" in a.reasons[0]


def test_global_batch_must_be_whole_sequences():
    with pytest.raises(AdviseError, match="--seq-length"):
        advise([1000] * 3, load_model("tiny"), load_profile("h200"), 1, 141e9, seq_length=2048, use_sim=False)


def test_memory_flag_errors_name_the_flag():
    assert parse_memory("141GB") == 141e9
    with pytest.raises(AdviseError, match="--gpu-memory"):
        parse_memory("lots")


def test_cli_advise(capsys):
    assert main(["advise", "--model", "llama-7b", "--cluster", "a800", "--nodes", "1", "--dataset", "fineweb",
                 "--global-batch-tokens", "256K", "--seq-length", "8K", "--no-sim"]) == 0
    out = capsys.readouterr().out
    assert "recommend: TP" in out and "GiB per GPU" in out and "why:" in out and "micro-batch" in out
    assert "torchrun --nnodes 1 --nproc-per-node 8" in out
    line = out.split("torchrun", 1)[1].split()
    seq, gbs = (int(line[line.index(f) + 1]) for f in ("--seq-length", "--global-batch-size"))
    assert seq * gbs == 256 * 1024 and line[line.index("--max-position-embeddings") + 1] == "8192"


LONG = [65536] + [2048] * 480  # 1M tokens, one document of the whole 64K context (issue 56 item 1)


@pytest.fixture(scope="module")
def long_context():
    return advise(LONG, load_model("llama-7b"), load_profile("a800"), 4, 80e9, seq_length=65536, tps=[1],
                  use_sim=False)


def test_zeppelin_searches_the_per_rank_share(long_context):
    """16 sequences of 64K cannot split over 32 ranks, but shares can: 8K x 4 steps on 32 ranks holds
    what CP 8 holds, and the line says so in Megatron's terms (--seq-length the share,
    --max-position-embeddings the longest document)."""
    z = [c for c in long_context.candidates if c.strategy == "zeppelin"]
    assert {(c.share, c.ga) for c in z} >= {(8192, 4), (16384, 2), (32768, 1)}
    c = next(c for c in z if c.share == 8192)
    m = load_model("llama-7b")
    flags = megatron_flags(c, m, 65536, sum(LONG), "a800", 8, 4)
    assert [flags[flags.index(f) + 1] for f in ("--seq-length", "--max-position-embeddings", "--global-batch-size",
                                                  "--micro-batch-size")] == ["8192", "65536", "128", "1"]
    assert check_consistency(flags, c, m, 32, 65536, sum(LONG)) == []
    # the longest document spans ranks at a share below it, and memory is the fullest rank's
    assert c.capacity_tokens < 65536 and c.capacity_tokens >= 8192
    # packed DP below the context keeps documents whole through the Zeppelin entry
    p = [c for c in long_context.candidates if c.strategy == "packed_dp"]
    assert p and all(c.zeppelin_entry and c.share < 65536 for c in p)
    assert "--zeppelin-strategy packed_dp" in command_line(p[0], m, 4, 8, 65536, sum(LONG), "a800", 4)


def test_shares_off_rule_zeppelin_out_as_before():
    a = advise(LONG, load_model("llama-7b"), load_profile("a800"), 4, 80e9, seq_length=65536, tps=[1],
               use_sim=False, share_steps=0)
    assert not any(c.strategy in ("zeppelin", "packed_dp") for c in a.candidates)
    assert any("not possible" in r for r in a.reasons)


def test_zeppelin_is_never_advised_with_megatron_fsdp(long_context, a13):
    for a in (long_context, a13):
        assert not any(c.zeppelin_entry and c.zero_stage >= 2 for c in a.candidates)
        assert any(not c.zeppelin_entry and c.zero_stage >= 2 for c in a.candidates)  # stock runs still weigh it
    m = load_model("llama-7b")
    best_z = min((c for c in long_context.candidates if c.strategy == "zeppelin"), key=lambda c: c.iteration_s)
    from megatron_zeppelin.advise.reasons import reasons
    assert any("Megatron-FSDP (ZeRO-2/3) with --zeppelin-balance has run nowhere" in r
               for r in reasons(best_z, long_context.candidates, 80e9))
    assert "--use-megatron-fsdp" not in megatron_flags(best_z, m, 65536, sum(LONG))


def test_lines_carry_the_flags_the_slurm_jobs_carry(long_context, a13):
    """One source (spec/megatron_flags.py): a Zeppelin line has what the plugin requires, a stock
    packed line the document masking of the SLURM dp job."""
    from megatron_zeppelin.slurm.args import megatron_args
    from megatron_zeppelin.spec.megatron_flags import ZEPPELIN_REQUIRED, document_masking_flags
    run = {"name": "x", "model": "llama-7b", "nodes": 1, "seq_length": 8192, "global_batch_tokens": "256K",
           "data_path": "/d"}
    dp_job, z_job = megatron_args(run, "dp"), megatron_args(run, "zeppelin")
    masking = [f for f in document_masking_flags() if f.startswith("--")]
    assert set(masking) <= set(dp_job)
    required = [f for f in ZEPPELIN_REQUIRED if f.startswith("--")]
    assert set(required) <= set(z_job)
    m13, m7 = load_model("llama-13b"), load_model("llama-7b")
    stock = [c for c in a13.candidates if not c.zeppelin_entry]
    assert {c.strategy for c in stock} >= {"packed_dp", "static_cp"}
    for c in stock[::17]:
        assert set(masking) <= set(megatron_flags(c, m13, SEQ, sum(BATCH)))
    for c in [c for c in long_context.candidates if c.zeppelin_entry][::13]:
        line = megatron_flags(c, m7, 65536, sum(LONG))
        assert set(required) <= set(line) and not (set(masking) - set(required)) & set(line)


def test_cli_advise_takes_the_workload_flags(tmp_path, capsys):
    """plan's workload flags (issue 56 item 10): a JSONL text dataset counted by --tokenizer, Megatron's
    --data-path / --global-batch-size / --micro-batch-size / --tensor-model-parallel-size; the output
    says how the tokens were counted."""
    import json
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps({"text": "x" * n}) + "\n" for n in [100, 5000, 300, 2000, 8000] * 20))
    assert main(["advise", "--model", "llama-7b", "--cluster", "a800", "--nodes", "1", "--data-path", str(data),
                 "--tokenizer", "byte", "--global-batch-size", "32", "--seq-length", "8K", "--micro-batch-size", "1",
                 "--tensor-model-parallel-size", "2", "--no-sim"]) == 0
    out = capsys.readouterr().out
    assert "counted by --tokenizer byte" in out and "--global-batch-size 32 x --seq-length 8192" in out
    assert "recommend: TP 2" in out and "--micro-batch-size 1 " in out
