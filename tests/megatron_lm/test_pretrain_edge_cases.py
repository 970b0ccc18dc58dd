"""The edge cases that break context parallelism in the field, through Megatron-LM's own training loop
(``megatron.training.pretrain`` via scripts/pretrain_gpt_zeppelin.py, gloo ranks, CPU shim): each
global micro-batch of one run is one case, so one launch per strategy trains them all, and the
per-iteration loss and grad norm equal Megatron's stock spec on the same documents (rel. 1e-5), and
are finite (Megatron's own NaN check is on: a NaN loss stops the run).

- a batch of one document (the whole global micro-batch; most ranks hold nothing in the attention
  layout under packed_dp, Megatron-LM #1764's "CP rank that holds only padding");
- documents of 1 token: a batch of them only (static_cp puts each on a CP ring whose other members
  hold nothing of it: Transformer Engine #3331's tail, mbridge's crash on a sequence shorter than
  TP x CP x 2), and one beside a long document;
- documents of exactly 2 x cp tokens and of 2 x cp + 1 (the zigzag ring's divisibility), cp the
  domain size; with TP 2, also 2 x cp x tp and one more.

The documents are written in the order the training split yields them (integration/blend.py
WholeDocuments: a permutation seeded by --seed and the split), checked by the planned document count
of every micro-batch (--zeppelin-debug-plan). The engine side of the same cases is
tests/multiproc/test_edge_cases.py.
"""

import math
import re

import numpy as np
import pytest

import mlm_run as m

PY = m.mlm_python()
pytestmark = [pytest.mark.megatron_lm,
              pytest.mark.skipif(PY is None, reason="no .venv-mlm (bash scripts/setup.sh makes it)")]
TOL = 1e-5
TIMEOUT = 600
SEED = 1234  # mlm_run.model_flags' --seed: the training split's document order


def cases(dp: int, tp: int = 1):
    """[(name, trained tokens per document)] of one global micro-batch each (SEQ x dp tokens)."""
    budget, cp = m.SEQ * dp, dp

    def fill(n):  # documents of n tokens, the last one cut to the budget
        k, rest = divmod(budget, n)
        return [n] * k + ([rest] if rest else [])

    tiny = ([1, 2, 1, 3] * budget)[:budget]
    while sum(tiny) > budget:
        tiny.pop()
    tiny.append(budget - sum(tiny))
    out = [("one_document", [budget]), ("one_token_documents", [1] * budget),
           ("one_token_beside_long", [1, budget - 1]),
           ("at_2cp", fill(2 * cp)), ("past_2cp", fill(2 * cp + 1)), ("tiny_documents", [n for n in tiny if n])]
    if tp > 1:
        out += [("at_2cp_tp", fill(2 * cp * tp)), ("past_2cp_tp", fill(2 * cp * tp + 1))]
    return out


def build_ordered_dataset(prefix: str, batches) -> str:
    """An indexed dataset whose training split (--split 100,0,0) yields the batches' documents in
    order: document perm[k] holds the k-th document, perm the split's seeded epoch-0 order."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    seq = [n + 1 for _, docs in batches for n in docs]  # a document of n+1 tokens trains n
    perm = np.random.default_rng([SEED, 0]).permutation(len(seq))  # WholeDocuments, train split (0)
    lengths = np.empty(len(seq), dtype=np.int64)
    lengths[perm] = seq
    rng = np.random.default_rng(1)
    b = IndexedDatasetBuilder(prefix + ".bin", dtype=np.int32)
    for n in lengths:
        b.add_document(np.asarray(rng.integers(1, m.VOCAB, int(n)), dtype=np.int32), [int(n)])
    b.finalize(prefix + ".idx")
    return prefix


def train(tmp_path, name, ranks, tp, extra):
    dp = ranks // tp
    batches = cases(dp, tp)
    work = tmp_path / name
    work.mkdir(parents=True, exist_ok=True)
    data = build_ordered_dataset(str(work / "docs"), batches)
    flags = m.model_flags(data) + ["--split", "100,0,0", "--train-iters", str(len(batches) // 2),
                                   "--global-batch-size", str(2 * dp), "--tensor-model-parallel-size", str(tp),
                                   "--tensorboard-dir", str(work / "tb"),
                                   # each micro-batch is one case: none regrouped with the next (the default, rounds)
                                   "--zeppelin-accumulation", "data_order"] + extra
    log = m.run(PY, ranks, flags, TIMEOUT, str(work))
    return m.scalars(str(work / "tb")), log, batches


def planned_documents(log):
    """Documents of each planned micro-batch (the class counts of rank 0's plan lines)."""
    return [sum(int(n) for n in re.findall(r"=(\d+)", line.split(" remap=")[0])) for line in m.plan_lines(log)]


# (strategy, its flags, ranks): every strategy on 4 ranks as 2 nodes x 2 (-m slow: about 45 s a launch
# on a loaded 2-core machine); the default run has the smallest: static_cp on 2 ranks, whose 1-token
# documents each sit on a CP ring of 2 whose other member holds nothing of them
# all -m slow (~20 s each): tests/multiproc/test_edge_cases.py runs every strategy's edge cases by default
STRATEGIES = [pytest.param("static_cp", ["--zeppelin-cp-size", "2", "--zeppelin-cp-comm-type", "p2p"], 2,
                           id="static_cp-2ranks", marks=pytest.mark.slow),
              pytest.param("zeppelin", [], 4, marks=pytest.mark.slow),
              # capacity for all 256 1-token documents on member 0: TE pads each to 2 x cp = 8 rows, and
              # member 0 holds two of its ring's 8 chunks (the first and the last, the token's), 2 rows each
              pytest.param("static_cp", ["--zeppelin-cp-size", "4", "--zeppelin-cp-comm-type", "p2p",
                                         "--zeppelin-capacity-tokens", str(8 * m.SEQ)], 4, marks=pytest.mark.slow),
              pytest.param("static_cp", ["--zeppelin-cp-size", "2", "--zeppelin-cp-comm-type", "a2a"], 4,
                           marks=pytest.mark.slow, id="static_cp_a2a"),
              pytest.param("allgather_cp", ["--zeppelin-cp-size", "4", "--zeppelin-capacity-tokens", str(8 * m.SEQ)], 4,
                           marks=pytest.mark.slow),
              pytest.param("dynamic_cp", [], 4, marks=pytest.mark.slow),
              # capacity for the whole one-document batch: packed_dp cannot split it
              pytest.param("packed_dp", ["--zeppelin-capacity-tokens", str(4 * m.SEQ)], 4, marks=pytest.mark.slow)]


_STOCK = {}  # (ranks, tp) -> the stock run's scalars: one reference launch per shape in a session


def stock(tmp_path_factory, ranks, tp):
    if (ranks, tp) not in _STOCK:
        _STOCK[(ranks, tp)] = train(tmp_path_factory.mktemp(f"stock{ranks}tp{tp}"), "stock", ranks, tp,
                                    ["--zeppelin-stock-spec"])[0]
    return _STOCK[(ranks, tp)]


def run_case(tmp_path, ref, strategy, extra, ranks=4, tp=1):
    zep = ["--zeppelin-balance", "--zeppelin-gpus-per-node", "2", "--zeppelin-debug-plan",
           "--zeppelin-strategy", strategy] + extra
    run, log, batches = train(tmp_path, strategy, ranks, tp, zep)
    iters = range(1, len(batches) // 2 + 1)
    # every micro-batch was the case it was written as (DP rank 0 of each TP rank prints one plan
    # line per micro-batch: with TP their lines interleave)
    docs, want = planned_documents(log), [len(d) for _, d in batches]
    if tp == 1:
        assert docs == want, (docs, [n for n, _ in batches])
    else:
        assert sorted(docs) == sorted(want * tp), (docs, [n for n, _ in batches])
    for tag in ("lm loss", "grad-norm"):
        assert sorted(run[tag]) == list(iters), (tag, sorted(run[tag]))
        for i in iters:
            a, b = run[tag][i], ref[tag][i]
            assert math.isfinite(a) and abs(a - b) <= TOL * abs(b), \
                f"{strategy}: {tag} at iteration {i}: {a} vs stock {b}"


@pytest.mark.parametrize("strategy,extra,ranks", STRATEGIES)
def test_edge_cases_match_stock_spec(strategy, extra, ranks, tmp_path, tmp_path_factory):
    run_case(tmp_path, stock(tmp_path_factory, ranks, 1), strategy, extra, ranks=ranks)


@pytest.mark.slow
@pytest.mark.parametrize("strategy,extra", [
    # static_cp: the 128 1-token documents padded to 2 x cp = 4 rows each, two of them on member 0
    ("zeppelin", []), ("static_cp", ["--zeppelin-cp-size", "2", "--zeppelin-capacity-tokens", str(4 * m.SEQ)])])
def test_edge_cases_match_stock_spec_tp2(strategy, extra, tmp_path, tmp_path_factory):
    run_case(tmp_path, stock(tmp_path_factory, 4, 2), strategy, extra, ranks=4, tp=2)
