"""Save at step k, resume, and the next losses equal those of the uninterrupted run."""

from dataclasses import asdict

from megatron_zeppelin.distributed.launch import run_distributed
from megatron_zeppelin.integration.data import build_corpus
from megatron_zeppelin.integration.trainer import TrainOptions, train_worker


def test_resume_continues_the_same_loss_trajectory(tmp_path):
    prefix = build_corpus(str(tmp_path / "corpus"), max_files=40)
    base = dict(steps=4, tokens_per_batch=1024, max_doc_tokens=256, data_path=prefix, warmup=1, progress=False,
                zeppelin={"strategy": "zeppelin", "gpus_per_node": 1})
    full = TrainOptions(**base, save=str(tmp_path / "ckpt"), save_interval=2)
    h_full = run_distributed(train_worker, 2, asdict(full), timeout=240)[0]["history"]
    resumed = TrainOptions(**base, load=str(tmp_path / "ckpt"), save="")
    # the checkpoint dir also holds step 4 (end of run): resume from step 2 explicitly
    (tmp_path / "ckpt" / "latest").write_text("2")
    h_res = run_distributed(train_worker, 2, asdict(resumed), timeout=240)[0]["history"]
    assert [h["step"] for h in h_res] == [3, 4]
    for a, b in zip(h_full[2:], h_res):
        assert abs(a["loss"] - b["loss"]) <= 1e-6 * abs(a["loss"]), (a["loss"], b["loss"])
        assert a["lr"] == b["lr"]
