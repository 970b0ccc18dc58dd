"""Stock Megatron GPT pre-training on packed samples, for megatron.training installs without a checkout.

megatron-core >= 0.19 ships ``megatron.training`` (``pretrain``) but not Megatron-LM's
``pretrain_gpt.py``. This is the GPT path of that script (at the commit named in patches/README.md)
for PP = 1 without MTP / SFT / FIM / distillation, written on megatron-core's own pieces and nothing
of the plugin's: ``GPTDataset`` samples of ``--seq-length`` tokens packed from the dataset's
documents (``BlendedMegatronDatasetBuilder``; ``MockGPTDataset`` with ``--mock-data``), the batch broadcast over TP
(``get_batch_on_this_tp_rank``) and split over CP (``get_batch_on_this_cp_rank``), THD
``PackedSeqParams`` from the dataset's ``cu_seqlens`` with ``--dataloader-inter-document-masking``,
and the masked per-token loss (sum, token count, report) with Megatron's NaN / Inf checks.

A module of the package, so a wheel install has it: ``torchrun ... -m
megatron_zeppelin.integration.pretrain_gpt_packed <pretrain_gpt.py flags>``. ``zeppelin slurm`` runs
it for the stock modes (``dp``, ``cp_*``) of a matrix with ``megatron_lm: ""``
(megatron_zeppelin/presets/runs/slurm_cpu.yaml), and advise's stock lines name it. Without CUDA,
the plugin's CPU shim for megatron.training (integration/cpu_megatron_lm.py) is installed first, as
for the Zeppelin entry (integration/pretrain_gpt.py). megatron is imported inside the functions, for
the reasons that module gives: importing this one patches nothing and needs no megatron.training.
"""

import sys
from functools import partial

import torch

from megatron_zeppelin.integration import cpu_megatron_lm
from megatron_zeppelin.integration.megatron_lm import use_prebuilt_dataset_helpers

PROG = "megatron_zeppelin.integration.pretrain_gpt_packed"  # as errors name this entry
KEYS = ("attention_mask", "cu_seqlens", "cu_seqlens_padded", "hybrid_cp_group", "labels", "local_cp_size",
        "loss_mask", "max_seqlen", "position_ids", "tokens")


def get_batch(data_iterator):
    from megatron.core import mpu
    from megatron.core.utils import (flatten_batch_for_packed_sequences, get_batch_on_this_cp_rank,
                                     get_batch_on_this_tp_rank)
    from megatron.training import get_args

    args = get_args()
    tp_rank = mpu.get_tensor_model_parallel_rank()
    thd = args.dataloader_inter_document_masking
    batch = {}
    if tp_rank == 0:
        sample = next(data_iterator)
        batch = {k: sample[k].cuda(non_blocking=True) if sample.get(k) is not None else None for k in KEYS}
    batch = get_batch_on_this_tp_rank(
        batch, has_cu_seqlens=thd, is_hybrid_cp=False,
        create_attention_mask_in_dataloader=args.create_attention_mask_in_dataloader,
        broadcast_src_rank=mpu.get_tensor_model_parallel_src_rank(),
        broadcast_group=mpu.get_tensor_model_parallel_group(), cp_size=args.context_parallel_size,
        tp_rank=tp_rank, micro_batch_size=args.micro_batch_size, seq_length=args.seq_length,
        mtp_on_this_rank=False, pipeline_model_parallel_size=1, is_pipeline_first_stage=True,
        is_pipeline_last_stage=True)
    batch = flatten_batch_for_packed_sequences(batch)
    return get_batch_on_this_cp_rank(batch, is_hybrid_cp=False, cp_group=mpu.get_context_parallel_group(),
                                     use_per_sequence_balancing=thd)


def loss_func(loss_mask, output_tensor):
    from megatron.core.rerun_state_machine import get_rerun_state_machine
    from megatron.training import get_args

    losses = output_tensor.view(-1).float()
    mask = loss_mask.view(-1).float()
    loss = torch.sum(losses * mask)
    num_tokens = mask.sum().clone().detach().to(torch.int)
    if get_args().check_for_nan_in_loss_and_grad:
        rsm = get_rerun_state_machine()
        rsm.validate_result(result=loss, rejection_func=torch.isnan, tolerance=0.0, fatal=True,
                            message="found NaN in local forward loss calculation")
        rsm.validate_result(result=loss, rejection_func=torch.isinf, tolerance=0.0, fatal=True,
                            message="found Inf in local forward loss calculation")
    return loss, num_tokens, {"lm loss": torch.cat([loss.clone().detach().view(1), num_tokens.view(1)])}


def forward_step(data_iterator, model, return_schedule_plan: bool = False):
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.training import get_args

    args = get_args()
    b = get_batch(data_iterator)
    packed = None
    if b.get("cu_seqlens") is not None:  # THD: attention restricted to each document
        cu, cu_pad = b["cu_seqlens"].squeeze(0), b.get("cu_seqlens_padded")
        cu_pad = cu_pad.squeeze(0) if cu_pad is not None else None
        cu_att = cu_pad if cu_pad is not None else cu
        packed = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu_att, cu_seqlens_kv=cu_att,
                                 cu_seqlens_q_padded=cu_pad, cu_seqlens_kv_padded=cu_pad,
                                 max_seqlen_q=int(b["max_seqlen"].item()), max_seqlen_kv=int(b["max_seqlen"].item()),
                                 tokens_per_sample=args.seq_length)
    out = model(b["tokens"], b["position_ids"], b["attention_mask"], labels=b["labels"],
                loss_mask=b["loss_mask"], packed_seq_params=packed)
    return out, partial(loss_func, b["loss_mask"])


def datasets_provider(train_val_test_num_samples, vp_stage=None):
    from megatron.core import mpu
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset
    from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer
    from megatron.training import get_args, print_rank_0
    from megatron.training.utils import get_blend_and_blend_per_split

    args = get_args()
    blend, blend_per_split = get_blend_and_blend_per_split(args)
    config = GPTDatasetConfig(
        random_seed=args.seed, sequence_length=args.seq_length, blend=blend, blend_per_split=blend_per_split,
        split=args.split, path_to_cache=args.data_cache_path, mmap_bin_files=args.mmap_bin_files,
        tokenizer=build_tokenizer(args), reset_position_ids=args.reset_position_ids,
        reset_attention_mask=args.reset_attention_mask, eod_mask_loss=args.eod_mask_loss,
        create_attention_mask=args.create_attention_mask_in_dataloader,
        context_parallel_size=args.context_parallel_size, data_parallel_size=args.data_parallel_size,
        sequence_parallel_size=args.tensor_model_parallel_size * args.sequence_parallel,
        inter_document_masking=args.dataloader_inter_document_masking)
    print_rank_0("> building train, validation, and test datasets for GPT ...")
    # --mock-data (advise's placeholder data): random documents, as pretrain_gpt.py builds them
    cls = MockGPTDataset if args.mock_data else GPTDataset
    return BlendedMegatronDatasetBuilder(cls, train_val_test_num_samples,
                                        lambda: mpu.get_tensor_model_parallel_rank() == 0, config).build()


datasets_provider.is_distributed = True


def main():
    cpu_megatron_lm.install()  # before megatron.training is imported; a no-op where CUDA exists
    from megatron.core.enums import ModelType
    from megatron.training import pretrain
    from megatron.training.argument_utils import gpt_config_from_args, pretrain_cfg_container_from_args
    from megatron.training.arguments import parse_and_validate_args

    args = parse_and_validate_args(args_defaults={"tokenizer_type": "GPT2BPETokenizer"})
    if args.pipeline_model_parallel_size != 1:
        sys.exit(f"{PROG}: pipeline parallelism needs Megatron-LM's pretrain_gpt.py "
                 "(set megatron_lm in the matrix)")
    use_prebuilt_dataset_helpers()  # pip's megatron-core: compiled helpers, no Makefile to run
    pretrain(pretrain_cfg_container_from_args(args, gpt_config_from_args(args)), datasets_provider,
             ModelType.encoder_or_decoder, forward_step)


if __name__ == "__main__":
    main()
