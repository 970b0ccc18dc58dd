"""After Megatron's ``pretrain(...)`` returns, ``megatron_lm.shutdown()`` destroys Megatron's groups and
every process group while Python is whole (left to interpreter exit, gloo can abort a finished run)."""

from megatron_zeppelin.distributed.launch import run_distributed


def _train_then_shut_down(rank, world):
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from megatron_zeppelin.integration import megatron_lm

    ps.initialize_model_parallel(tensor_model_parallel_size=1)
    t = torch.ones(4)
    work = dist.all_reduce(t, group=ps.get_data_parallel_group(), async_op=True)  # like pretrain's last step
    work.wait()
    before = (dist.is_initialized(), ps.model_parallel_is_initialized())
    megatron_lm.shutdown()
    after = (dist.is_initialized(), ps.model_parallel_is_initialized())
    megatron_lm.shutdown()  # twice is harmless (a script may also end in the launcher's clean-up)
    return before, after, float(t[0])


def test_shutdown_destroys_every_process_group_after_pretrain():
    for rank, (before, after, total) in enumerate(run_distributed(_train_then_shut_down, 2, timeout=120)):
        assert before == (True, True), rank
        assert after == (False, False), rank
        assert total == 2.0, rank
