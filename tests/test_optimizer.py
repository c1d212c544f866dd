"""build_optimizer: which parameters decay, the word embeddings' own learning rate, layer-wise decay and Muon; and the
gradient clipping of the Trainer's step."""

import argparse

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import get_scheduler

from sinebert import SineBertForMaskedLM, SineBertForSequenceClassification
from sinebert.training import optimizer as optimizers
from sinebert.training.optimizer import build_optimizer, fused_row_blocks, iteration_cost, owners_of
from sinebert.training.loop import setup_accelerator
from tests.conftest import (classifier_step_setup, classifier_trainer, gradients_at_optimizer_step, load_script,
                            tiny_config)


def _args(**values) -> argparse.Namespace:
    defaults = dict(learning_rate=1e-2, embedding_learning_rate=None, layerwise_lr_decay=1.0, weight_decay=0.01,
                    adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, optim="adamw", muon_learning_rate=None)
    return argparse.Namespace(**defaults | values)


@pytest.mark.parametrize("cls", [SineBertForMaskedLM, SineBertForSequenceClassification])
@pytest.mark.parametrize("embedding_learning_rate", [None, 0.0])
def test_word_embeddings_take_their_own_learning_rate_and_every_parameter_is_stepped_once(cls, embedding_learning_rate):
    torch.manual_seed(0)
    model = cls(tiny_config(num_labels=2))
    optimizer = build_optimizer(model, _args(embedding_learning_rate=embedding_learning_rate))
    stepped = [id(p) for group in optimizer.param_groups for p in group["params"]]
    assert sorted(stepped) == sorted({id(p) for p in model.parameters()})  # the tied decoder counts once
    words = model.get_input_embeddings().weight
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    inputs = {"input_ids": torch.randint(5, 99, (2, 8)), "labels": torch.tensor([0, 1])}
    if cls is SineBertForMaskedLM:
        inputs["labels"] = inputs["input_ids"]
    model(**inputs).loss.backward()
    optimizer.step()
    changed = {name for name, p in model.named_parameters() if not torch.equal(p, before[name])}
    name = "sinebert.embeddings.word_embeddings.weight"
    assert (name in changed) == (embedding_learning_rate is None)
    assert "sinebert.layers.0.mlp.fc1.weight" in changed
    if embedding_learning_rate is not None:
        (group,) = [g for g in optimizer.param_groups if any(p is words for p in g["params"])]
        assert group["lr"] == embedding_learning_rate and group["params"] == [words]
        assert group["weight_decay"] == 0.01  # decayed as every embedding is


def test_layerwise_decay_gives_each_layer_its_share_of_the_learning_rate():
    model = SineBertForSequenceClassification(tiny_config(num_labels=2, num_hidden_layers=2))
    optimizer = build_optimizer(model, _args(layerwise_lr_decay=0.5))
    rate = {id(p): group["lr"] for group in optimizer.param_groups for p in group["params"]}
    named = dict(model.named_parameters())
    expected = {"classifier.weight": 1e-2, "sinebert.layers.1.mlp.fc1.weight": 5e-3,
                "sinebert.layers.0.attention.qkv_proj.bias": 2.5e-3, "sinebert.layers.0.mlp_norm.weight": 2.5e-3,
                "sinebert.embeddings.word_embeddings.weight": 1.25e-3}
    assert {name: rate[id(named[name])] for name in expected} == pytest.approx(expected)
    assert optimizer.param_groups[0]["lr"] == 1e-2  # what the loop logs as the learning rate
    decays = {id(p): group["weight_decay"] for group in optimizer.param_groups for p in group["params"]}
    assert decays[id(named["sinebert.layers.0.mlp.fc1.weight"])] == 0.01
    assert decays[id(named["sinebert.layers.0.mlp.fc1.bias"])] == 0.0
    assert decays[id(named["sinebert.layers.0.mlp_norm.weight"])] == 0.0  # norms do not decay (BERT's recipe)
    assert decays[id(named["sinebert.embeddings.LayerNorm.weight"])] == 0.0
    assert len(rate) == len(named)


def test_without_layerwise_decay_every_parameter_has_the_learning_rate():
    model = SineBertForSequenceClassification(tiny_config(num_labels=2, num_hidden_layers=2))
    optimizer = build_optimizer(model, _args())
    assert [group["lr"] for group in optimizer.param_groups] == [1e-2, 1e-2]
    assert [group["weight_decay"] for group in optimizer.param_groups] == [0.01, 0.0]


def test_muon_steps_the_encoder_layers_matrices_and_adamw_the_rest_each_at_its_own_peak():
    model = SineBertForSequenceClassification(tiny_config(num_labels=2, num_hidden_layers=2))
    optimizer = build_optimizer(model, _args(optim="muon"))
    named = {id(p): name for name, p in model.named_parameters()}
    by = {key: {named[id(p)] for g in part.param_groups for p in g["params"]} for key, part in optimizer.parts.items()}
    assert by["muon"].isdisjoint(by["adamw"]) and by["muon"] | by["adamw"] == set(named.values())
    layers = {f"sinebert.layers.{i}.{m}.weight" for i in range(2)
              for m in ("attention.qkv_proj", "attention.out_proj", "mlp.fc1", "mlp.fc2")}
    assert by["muon"] == layers | {"dense.weight"}  # and the pooler's square transform
    # The embeddings and the output layer are not hidden matrices: AdamW steps them.
    assert {"sinebert.embeddings.word_embeddings.weight", "classifier.weight"} <= by["adamw"]
    assert [(g["optimizer"], g["lr"], g["weight_decay"]) for g in optimizer.param_groups] == [
        ("adamw", 1e-2, 0.01), ("adamw", 1e-2, 0.0), ("muon", 4e-2, 0.01)]  # AdamW's peak first: the one logged
    assert build_optimizer(model, _args(optim="muon", muon_learning_rate=3e-3)).param_groups[-1]["lr"] == 3e-3


def test_muon_with_adamw_resumes_exactly_from_its_state_dict_under_its_schedule(tmp_path):
    torch.manual_seed(0)
    model = SineBertForMaskedLM(tiny_config())
    start = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.randint(5, 99, (2, 8))

    def run(optimizer, scheduler, steps):
        for _ in range(steps):
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()

    def fresh():
        optimizer = build_optimizer(model, _args(optim="muon"))
        return optimizer, get_scheduler("linear", optimizer, num_warmup_steps=2, num_training_steps=10)

    optimizer, scheduler = fresh()
    run(optimizer, scheduler, 3)
    torch.save(optimizer.state_dict(), tmp_path / "optimizer.bin")  # as accelerate's save_state writes it
    middle, schedule = {k: v.clone() for k, v in model.state_dict().items()}, scheduler.state_dict()
    run(optimizer, scheduler, 3)
    uninterrupted = {k: v.clone() for k, v in model.state_dict().items()}

    model.load_state_dict(middle)
    optimizer, scheduler = fresh()
    optimizer.load_state_dict(torch.load(tmp_path / "optimizer.bin", weights_only=True))
    scheduler.load_state_dict(schedule)
    run(optimizer, scheduler, 3)
    assert all(torch.equal(uninterrupted[k], v) for k, v in model.state_dict().items())
    assert not torch.equal(start["sinebert.layers.0.mlp.fc1.weight"], uninterrupted["sinebert.layers.0.mlp.fc1.weight"])
    # Both parts read the loaded groups and state: without that, Muon would restart its momentum and the scheduler's
    # rates would not reach it.
    assert optimizer.parts["muon"].param_groups[0] is optimizer.param_groups[-1]
    assert optimizer.parts["muon"].param_groups[0]["lr"] == pytest.approx(4 * optimizer.param_groups[0]["lr"])


def _muon_steps(rank: int = 0, world_size: int = 1, store: str | None = None, out: str | None = None,
                dtype: torch.dtype = torch.bfloat16) -> dict:
    """Three Muon steps of a tiny masked LM on fixed batches, as process `rank` of `world_size` (after the all-reduce
    every process has the same gradients: here the same batch), iterating in `dtype`; returns or saves the parameters
    and the number of matrices this process orthogonalised."""
    if world_size > 1:
        torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    calls, iterate = [], optimizers.newton_schulz
    optimizers.newton_schulz = lambda *a: calls.append(1) or iterate(*a)
    try:
        torch.manual_seed(0)
        model = SineBertForMaskedLM(tiny_config(num_hidden_layers=2))
        optimizer = build_optimizer(model, _args(optim="muon"), rank=rank, world_size=world_size,
                                    iteration_dtype=dtype)
        for step in range(3):
            ids = torch.randint(5, 99, (2, 8), generator=torch.Generator().manual_seed(step))
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    finally:
        optimizers.newton_schulz = iterate
    result = {**{k: v.detach().clone() for k, v in model.state_dict().items()}, "calls": torch.tensor(len(calls))}
    if world_size > 1:
        save_file(result, f"{out}{rank}")
        torch.distributed.destroy_process_group()
    return result


DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def _split_steps(rank: int, folder: str, threads: int):
    """Process `rank` of two: `_muon_steps` in each dtype (one spawn for both: a process spends most of its time
    importing), on the test's threads: a bf16 matrix product's rounding depends on how many threads share it."""
    torch.set_num_threads(threads)
    for name, dtype in DTYPES.items():
        _muon_steps(rank, 2, f"{folder}/store-{name}", f"{folder}/{name}-", dtype)


def test_muon_split_across_data_parallel_processes_steps_as_one_process_does(tmp_path):
    torch.multiprocessing.spawn(_split_steps, args=(str(tmp_path), torch.get_num_threads()), nprocs=2)
    for name, dtype in DTYPES.items():
        one = _muon_steps(dtype=dtype)
        split = [load_file(tmp_path / f"{name}-{rank}") for rank in (0, 1)]
        # Every step: two layers' 4 weights (qkv_proj, its 12 blocks in one batch, then out_proj, fc1, fc2) and the
        # head's transform.
        assert one["calls"] == 3 * (2 * 4 + 1)
        # Each process its share of them, balanced by cost: one both fc1, one out_proj and the head's transform; the
        # other both fc2, the other out_proj and both query-key-value weights.
        assert [s["calls"].item() for s in split] == [3 * 4, 3 * 5]
        for key, value in one.items():
            if key != "calls":
                assert torch.equal(split[0][key], value) and torch.equal(split[1][key], value), (name, key)


def test_muon_in_bf16_steps_as_torchs_muon_does_and_in_float32_orthogonalises_more_exactly():
    torch.manual_seed(0)
    weights = [torch.nn.Parameter(torch.randn(shape)) for shape in ((24, 8), (8, 8), (8, 32))]
    copies = [torch.nn.Parameter(w.detach().clone()) for w in weights]
    ours = optimizers.Muon(weights, adjust_lr_fn="match_rms_adamw", lr=0.05, weight_decay=0.1)
    torchs = torch.optim.Muon(copies, adjust_lr_fn="match_rms_adamw", lr=0.05, weight_decay=0.1)
    for step in range(3):
        grads = [torch.randn(w.shape, generator=torch.Generator().manual_seed(step)) for w in weights]
        for params, optimizer in ((weights, ours), (copies, torchs)):
            for p, g in zip(params, grads):
                p.grad = g.clone()
            optimizer.step()
    assert all(torch.equal(w, c) for w, c in zip(weights, copies))
    # The iterations in float32 leave the singular values where bf16's do (about 0.7 to 1.2), without its rounding.
    g = torch.randn(24, 8, generator=torch.Generator().manual_seed(0))
    before = g.clone()
    coefficients = ours.defaults["ns_coefficients"]
    exact, rounded = (optimizers.newton_schulz(g, coefficients, 5, 1e-7, dtype)
                      for dtype in (torch.float32, torch.bfloat16))
    assert exact.dtype == torch.float32 and rounded.dtype == torch.bfloat16
    assert torch.equal(g, before)  # not in place: in float32 g may be the momentum buffer itself
    values = torch.linalg.svdvals(exact.double())
    assert values.min() > 0.6 and values.max() < 1.3
    assert 0 < (exact - rounded.float()).abs().max() < 0.05


def test_muon_steps_each_projection_of_a_fused_weight_as_torchs_muon_steps_them_apart():
    """A query-key-value weight is three matrices stacked: orthogonalised (and scaled) block by block, as torch's Muon
    steps three separate ones (up to the rounding in which a batched product may differ from single ones), and not as
    it steps the stack."""
    torch.manual_seed(0)
    fused = torch.nn.Parameter(torch.randn(3 * 8, 16))
    apart = [torch.nn.Parameter(block.detach().clone()) for block in fused.split(8)]
    stacked = torch.nn.Parameter(fused.detach().clone())
    settings = dict(adjust_lr_fn="match_rms_adamw", lr=0.05, weight_decay=0.1)
    ours = optimizers.Muon([fused], row_blocks=[3], **settings)
    torchs, torchs_stacked = torch.optim.Muon(apart, **settings), torch.optim.Muon([stacked], **settings)
    for step in range(3):
        grad = torch.randn(fused.shape, generator=torch.Generator().manual_seed(step))
        for param, block in ((fused, grad), (stacked, grad), *zip(apart, grad.split(8))):
            param.grad = block.clone()
        for optimizer in (ours, torchs, torchs_stacked):
            optimizer.step()
    assert (fused - torch.cat(apart)).abs().max() < 2e-3
    assert (fused - stacked).abs().max() > 1e-2


@pytest.mark.parametrize("shape", [(12, 8, 32), (2, 32, 8)])  # 12 heads' wide blocks; a GLU's two tall ones
def test_a_batch_of_blocks_orthogonalises_each_block_as_it_would_alone(shape):
    """A fused weight's blocks go through one batched product: each comes out as it would alone, up to the rounding
    in which batched and single products may differ, and far from what the stack gets as one matrix."""
    blocks = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    coefficients = torch.optim.Muon([torch.nn.Parameter(torch.zeros(2, 2))]).defaults["ns_coefficients"]
    for dtype, rounding in ((torch.float32, 1e-4), (torch.bfloat16, 3e-2)):
        batched = optimizers.newton_schulz(blocks, coefficients, 5, 1e-7, dtype)
        alone = torch.stack([optimizers.newton_schulz(block, coefficients, 5, 1e-7, dtype) for block in blocks])
        whole = optimizers.newton_schulz(blocks.reshape(-1, shape[-1]), coefficients, 5, 1e-7, dtype)
        assert batched.dtype == dtype and batched.shape == blocks.shape
        assert (batched - alone).float().abs().max() <= rounding
        assert (whole.reshape(shape) - alone).float().abs().max() > 3 * rounding


def test_the_fused_weights_are_each_heads_query_key_and_value_and_a_glus_gate_and_value():
    for mlp_type, fc1_blocks in (("mlp", None), ("glu", 2)):
        model = SineBertForMaskedLM(tiny_config(num_hidden_layers=2, num_attention_heads=4, mlp_type=mlp_type))
        blocks = {name: fused_row_blocks(model).get(p) for name, p in model.named_parameters()}
        assert {name: n for name, n in blocks.items() if n} == {
            **{f"sinebert.layers.{i}.attention.qkv_proj.weight": 12 for i in range(2)},
            **({f"sinebert.layers.{i}.mlp.fc1.weight": fc1_blocks for i in range(2)} if fc1_blocks else {})}


def test_the_trainer_iterates_in_bf16_only_where_the_hardware_multiplies_it_at_speed(monkeypatch):
    from sinebert.training import loop

    cpu = torch.device("cpu")
    for flags, vendor, fast in (({"avx2"}, "AuthenticAMD", False), ({"avx512_bf16"}, "AuthenticAMD", True),
                                ({"avx512_bf16"}, "GenuineIntel", False), ({"amx_bf16"}, "GenuineIntel", True)):
        monkeypatch.setattr(loop, "_cpu_flags", lambda: (vendor, flags))
        assert loop.bf16_matmuls_are_fast(cpu)[0] is fast
        assert loop.muon_iteration_dtype(cpu)[0] == (torch.bfloat16 if fast else torch.float32)
    model = SineBertForMaskedLM(tiny_config())
    optimizer = build_optimizer(model, _args(optim="muon"), world_size=1, iteration_dtype=torch.float32)
    description = optimizers.describe_optimizer(optimizer, "this CPU has no bf16 matrix instructions")
    assert description == ("Muon on 9 matrices (Newton-Schulz iterations in float32, fused weights by head and "
                           "projection: this CPU has no bf16 matrix instructions), AdamW on the rest")


def test_muon_shares_balance_the_orthogonalisation_work():
    # The cram's model: 4 layers (4 heads' query, key and value as 12 blocks of 64 x 256) and the head's transform.
    layer = [iteration_cost((64, 256), 12), iteration_cost((256, 256)), iteration_cost((1024, 256)),
             iteration_cost((256, 1024))]
    costs = layer * 4 + [iteration_cost((256, 256))]
    owners = owners_of(costs, 2)
    work = [sum(cost for cost, o in zip(costs, owners) if o == r) for r in (0, 1)]
    assert max(work) / min(work) < 1.05
    assert owners_of(layer, 1) == [0] * 4 and sorted(set(owners_of(layer, 3))) == [0, 1, 2]
    assert iteration_cost((1024, 256)) == iteration_cost((256, 1024)) == 256**2 * 1024


@pytest.mark.parametrize("max_grad_norm", [0.0, 1e-3, 1e3])
def test_a_step_scales_the_gradient_down_to_max_grad_norm_and_reports_its_norm_before(tmp_path, max_grad_norm):
    script = load_script("finetune_classification")
    args = script.parse_args(["--train_file", "unused.tsv", "--output_dir", str(tmp_path), "--adversarial_epsilon", "0",
                              "--max_grad_norm", str(max_grad_norm)])
    model, reference, rows, batch = classifier_step_setup()
    reference(**batch).loss.backward()
    expected = {name: p.grad for name, p in reference.named_parameters() if p.grad is not None}
    norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in expected.values()]))
    assert 1e-3 < norm < 1e3  # one bound clips, the other does not
    trainer = classifier_trainer(args, setup_accelerator(args), model, rows)
    reported = {}
    step = trainer._optimizer_step
    trainer._optimizer_step = lambda *a: reported.setdefault("result", step(*a))
    seen = gradients_at_optimizer_step(trainer, model, batch)
    scale = min(1.0, max_grad_norm / norm.item()) if max_grad_norm else 1.0
    for name, gradient in expected.items():
        torch.testing.assert_close(seen[name], gradient * scale, rtol=1e-4, atol=1e-9, msg=name)
    grad_norm = reported["result"][3]
    assert grad_norm is None if not max_grad_norm else grad_norm.item() == pytest.approx(norm.item(), rel=1e-4)
