"""Checkpoints: resume reproduces the uninterrupted run bit for bit; a rank killed in the middle of a
save leaves the previous checkpoint as the latest, and the run resumes from it; the checkpoint is
Megatron's dist_checkpointing format and loads into a stock megatron-core GPTModel."""

import os
import signal
from dataclasses import asdict

import pytest

from megatron_zeppelin.distributed.launch import DistributedFailure, run_distributed
from megatron_zeppelin.integration.checkpoint import MARKER, _results_queue_in_process, step_dir
from megatron_zeppelin.integration.data import build_corpus
from megatron_zeppelin.integration.trainer import TrainOptions, train_worker


def _killed_in_save(rank, world, options, victim, step):
    """train_worker, but ``victim`` is SIGKILLed right after writing its shard of ``step``'s checkpoint,
    while the other ranks are still saving (no metadata written, nothing renamed)."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async as fa
    real = fa.FileSystemWriterAsync.write_preloaded_data_multiproc

    def write_then_die(transform_list, use_msc, r, write_buckets, queue):
        real(transform_list, use_msc, r, write_buckets, queue)
        if rank == victim and any(f"iter_{step:07d}" in b[0] for b in write_buckets):
            os.kill(os.getpid(), signal.SIGKILL)

    fa.FileSystemWriterAsync.write_preloaded_data_multiproc = staticmethod(write_then_die)
    return train_worker(rank, world, options)


def _resume_then_load_stock(rank, world, options, dirs):
    """Resume training, then load each checkpoint in ``dirs`` into a stock-spec GPTModel with
    megatron-core's own loader (what Megatron-LM does with --ckpt-format torch_dist)."""
    import torch
    from megatron.core import dist_checkpointing

    from megatron_zeppelin.integration.runtime import build_model
    from megatron_zeppelin.spec.model import load_model

    out = train_worker(rank, world, options)
    weights = []
    for d in dirs:
        stock = build_model(load_model(options["model"]), zeppelin=False, max_seq=4096)
        stock.load_state_dict(dist_checkpointing.load({"model": stock.sharded_state_dict()}, d)["model"])
        weights.append(torch.cat([p.detach().flatten() for p in stock.parameters()]))
    out["same_weights"] = all(torch.equal(weights[0], w) for w in weights[1:])
    return out


def test_the_write_results_queue_hands_over_what_was_put_at_once(monkeypatch):
    """megatron's finalize reads the writers' results with ``get_nowait`` after a barrier; a queue whose
    put returns before the item is readable (``multiprocessing.Queue``) fails a save on a loaded host."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async as fa
    monkeypatch.setattr(fa, "_results_queue", None)
    _results_queue_in_process()
    q = fa._get_write_results_queue()
    for i in range(100):
        q.put({i: []})
        assert q.get_nowait() == {i: []}


def test_kill_in_save_then_resume_reproduces_the_run_bit_for_bit(tmp_path):
    prefix = build_corpus(str(tmp_path / "corpus"), max_files=40)
    base = dict(steps=4, tokens_per_batch=1024, max_doc_tokens=256, data_path=prefix, warmup=1, progress=False,
                zeppelin={"strategy": "zeppelin", "gpus_per_node": 1})
    full, killed, resumed = (str(tmp_path / n) for n in ("full", "killed", "resumed"))
    h_full = run_distributed(train_worker, 2, asdict(TrainOptions(**base, save=full, save_interval=2)),
                             timeout=240)[0]["history"]
    assert sorted(os.listdir(full)) == sorted([MARKER, "iter_0000002", "iter_0000004"])

    with pytest.raises(DistributedFailure) as e:
        run_distributed(_killed_in_save, 2, asdict(TrainOptions(**base, save=killed, save_interval=2)), 1, 4,
                        timeout=240)
    d = e.value.diagnosis
    assert (d.rank, d.kind, d.exitcode) == (1, "signal", -9), str(e.value)
    assert "step 4, in saving checkpoint" in d.headline and "iter_0000004.tmp" in d.headline, d.headline
    assert open(os.path.join(killed, MARKER)).read() == "2"  # the half-written save is not the latest
    assert os.path.isdir(step_dir(killed, 4) + ".tmp") and not os.path.exists(step_dir(killed, 4))

    opts = TrainOptions(**base, load=killed, save=resumed, save_interval=2)
    res = run_distributed(_resume_then_load_stock, 2, asdict(opts),
                          [step_dir(full, 4), step_dir(resumed, 4)], timeout=240)[0]
    h_res = res["history"]
    assert [h["step"] for h in h_res] == [3, 4]
    for a, b in zip(h_full[2:], h_res):
        assert (a["loss"], a["lr"], a["grad_norm"]) == (b["loss"], b["lr"], b["grad_norm"])  # bit for bit
    assert res["same_weights"]  # and the final weights, loaded by megatron-core into the stock model
