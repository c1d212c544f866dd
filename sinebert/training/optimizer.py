"""The optimizer every script steps: AdamW, or Muon on the encoder's weight matrices with AdamW on the rest.

Param groups carry their own learning rate (word embeddings, layer-wise decay, Muon's own peak); the scheduler scales
each from there, so one schedule drives them all.
"""

import math
import re

import torch
from torch import nn

# `--optim` choices. Muon (Jordan et al., 2024) orthogonalises each weight matrix's momentum by Newton-Schulz
# iterations, so every direction of the matrix moves at the same rate; it is meant for hidden matrices only, so the
# embeddings, output layers, norms and biases stay with AdamW.
OPTIMIZERS = ("adamw", "muon")
# Muon's peak learning rate as a multiple of AdamW's when --muon_learning_rate is not given. With
# adjust_lr_fn="match_rms_adamw" (Liu et al., 2025) an update has AdamW's typical size at equal rates; at the cram's
# size 4x learnt most per step (docs/SPEED.md).
MUON_LEARNING_RATE_RATIO = 4


def layer_depth(name: str, num_layers: int) -> int:
    """Where a parameter sits for --layerwise_lr_decay: 0 for the embeddings, i + 1 for encoder layer i, and
    num_layers + 1 for everything above them (final norm, pooler, task head)."""
    if re.search(r"(^|\.)embeddings\.", name):
        return 0
    layer = re.search(r"(^|\.)layers?\.(\d+)\.", name)
    return int(layer.group(2)) + 1 if layer else num_layers + 1


def takes_muon(name: str, parameter: nn.Parameter, num_layers: int) -> bool:
    """Whether --optim muon steps `parameter` with Muon: the weight matrices inside the encoder layers and the square
    ones above them (a head's hidden-to-hidden transform: the masked-LM head's, the pooler's). The embeddings and the
    output layers (to the vocabulary, labels or span ends) stay with AdamW. The head's transform under Muon learnt more
    per step: 25.9% held-out masked-token accuracy after 400 steps at the cram's size against 24.9% (docs/SPEED.md)."""
    depth = layer_depth(name, num_layers)
    if parameter.ndim != 2 or depth == 0:
        return False
    return depth <= num_layers or parameter.shape[0] == parameter.shape[1]


def build_optimizer(model: nn.Module, args, *, rank: int = 0, world_size: int = 1,
                    iteration_dtype: torch.dtype = torch.bfloat16) -> torch.optim.Optimizer:
    """AdamW (or with --optim muon, MuonWithAdamW) with weight decay on weight matrices and embeddings only, never on
    biases or LayerNorm parameters; the word embeddings in a group of their own at --embedding_learning_rate when it
    is given; with --layerwise_lr_decay d < 1, a layer's parameters at d^(layers above it + 1) of the learning rate.
    AdamW's groups come first, the head's first among them, so that the logged learning rate is AdamW's peak.
    Muon's iterations run in `iteration_dtype`, split among `world_size` data-parallel processes, this one `rank`
    (see Muon)."""
    words = model.get_input_embeddings().weight if args.embedding_learning_rate is not None else None
    decay_rate, num_layers = args.layerwise_lr_decay, model.config.num_hidden_layers
    muon = args.optim == "muon"
    muon_rate = args.muon_learning_rate
    if muon_rate is None:
        muon_rate = MUON_LEARNING_RATE_RATIO * args.learning_rate
    groups, seen = {}, set() if words is None else {id(words)}
    for module_name, module in model.named_modules():
        for name, parameter in module.named_parameters(recurse=False):
            if id(parameter) in seen or not parameter.requires_grad:
                continue  # tied weights appear twice
            seen.add(id(parameter))
            full_name = f"{module_name}.{name}"
            exempt = isinstance(module, nn.LayerNorm) or name == "bias"
            below = num_layers + 1 - layer_depth(full_name, num_layers) if decay_rate != 1 else 0
            by_muon = muon and takes_muon(full_name, parameter, num_layers)
            groups.setdefault((by_muon, below, exempt), []).append(parameter)
    adamw_groups, muon_groups = [], []
    for (by_muon, below, exempt), params in sorted(groups.items()):
        rate = muon_rate if by_muon else args.learning_rate
        (muon_groups if by_muon else adamw_groups).append(
            {"params": params, "weight_decay": 0.0 if exempt else args.weight_decay, "lr": rate * decay_rate**below})
    if words is not None and words.requires_grad:
        adamw_groups.append({"params": [words], "weight_decay": args.weight_decay, "lr": args.embedding_learning_rate})
    adamw = {"betas": (args.adam_beta1, args.adam_beta2), "eps": args.adam_epsilon,
             "fused": fusable(adamw_groups + muon_groups)}
    if not muon:
        return torch.optim.AdamW(adamw_groups, **adamw)
    return MuonWithAdamW(adamw_groups, muon_groups, **adamw,
                         muon=dict(iteration_dtype=iteration_dtype, rank=rank, world_size=world_size,
                                   row_blocks=row_blocks_of(muon_groups, fused_row_blocks(model))))


def fused_row_blocks(model: nn.Module) -> dict[nn.Parameter, int]:
    """The weight matrices that stack several projections by rows, and how many: each attention's query, key and value
    projection (`qkv_proj`), head by head (3 x heads blocks of head_dim rows), and a GLU's gate and value (`fc1` with
    `mlp_type="glu"`, 2). Muon orthogonalises each block as a matrix of its own: together, one block's large gradient
    directions would shrink the others' steps. Moonlight's and modded-nanogpt's authors found that the query, key and
    value train better apart, GLM-5's that heads do too; at the cram's size, 800 steps learnt 32.0% held-out
    masked-token accuracy head by head, 31.6% by projection and 31.4% as one matrix (docs/SPEED.md)."""
    config = model.config
    glu = getattr(config, "mlp_type", "mlp") == "glu"
    blocks = {}
    for name, parameter in model.named_parameters():
        if name.endswith("qkv_proj.weight"):
            blocks[parameter] = 3 * config.num_attention_heads
        elif glu and name.endswith("mlp.fc1.weight"):
            blocks[parameter] = 2
    return blocks


def row_blocks_of(groups: list[dict], fused: dict[nn.Parameter, int]) -> list[int]:
    """How many projections each parameter of `groups` stacks, in the groups' order: Muon's `row_blocks`."""
    return [fused.get(param, 1) for group in groups for param in group["params"]]


def describe_optimizer(optimizer: torch.optim.Optimizer, why: str) -> str:
    """What steps the model, for the log and the results: the optimizer and, for Muon, how its iterations run and
    (`why`) the reason for their dtype."""
    if not isinstance(optimizer, MuonWithAdamW):
        return type(optimizer).__name__
    muon = optimizer.parts["muon"]
    matrices = sum(len(group["params"]) for group in muon.param_groups)
    return f"Muon on {matrices} matrices ({muon.describe()}: {why}), AdamW on the rest"


def loss_of(closure) -> torch.Tensor | None:
    """What an optimizer's step(closure) returns: the closure's loss, computed with gradients, or None."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def fusable(groups: list[dict]) -> bool:
    """Whether AdamW's fused kernel can step `groups`: it updates all parameters in one pass, 4x faster than the
    per-tensor loop on CPU (measured here: 19 ms vs 78 ms a step for a 7M-parameter model), but needs plain tensors
    on CPU or CUDA."""
    return all(type(p) is nn.Parameter and p.device.type in ("cpu", "cuda") for g in groups for p in g["params"])


class MuonWithAdamW(torch.optim.Optimizer):
    """torch.optim.Muon on `muon_groups` and torch.optim.AdamW on `adamw_groups`, stepped, scheduled and saved as one
    optimizer.

    Both parts read this optimizer's own param group dicts and per-parameter state, so that the scheduler's learning
    rates reach them and its state_dict is torch's usual one: one list of groups, AdamW's first, each tagged with its
    "optimizer".
    """

    def __init__(self, adamw_groups: list[dict], muon_groups: list[dict], betas: tuple[float, float], eps: float,
                 fused: bool, muon: dict | None = None):
        for name, groups in (("adamw", adamw_groups), ("muon", muon_groups)):
            for group in groups:
                group["optimizer"] = name  # saved with the group, so that a loaded one finds its part again
        adamw = torch.optim.AdamW(adamw_groups, betas=betas, eps=eps, fused=fused)
        # match_rms_adamw scales each matrix's orthogonal update to AdamW's typical size, 0.2 sqrt(max(rows, cols)).
        muon = Muon(muon_groups, adjust_lr_fn="match_rms_adamw", **(muon or {}))
        super().__init__(adamw.param_groups + muon.param_groups, {})
        self.parts = {"adamw": adamw, "muon": muon}
        self._share()

    def _share(self):
        """Hand each part its groups (the very dicts of this optimizer, which load_state_dict replaces) and this
        optimizer's state (keyed by parameter: each part reads only its own)."""
        for name, part in self.parts.items():
            part.param_groups = [group for group in self.param_groups if group["optimizer"] == name]
            part.state = self.state

    @torch.no_grad()
    def step(self, closure=None):
        loss = loss_of(closure)
        for part in self.parts.values():
            part.step()
        return loss

    def load_state_dict(self, state_dict: dict):
        super().load_state_dict(state_dict)
        self._share()


class Muon(torch.optim.Muon):
    """torch.optim.Muon, with its Newton-Schulz iterations in `iteration_dtype`, split among data-parallel processes,
    and on each projection of a fused weight on its own.

    - torch iterates in bf16, which only a GPU from Ampere on or a CPU with bf16 matrix units (AMX, AMD's
      AVX512-BF16) multiplies at speed: on a CPU with AVX2 alone the iterations of the cram's model took 12 s a step
      in bf16 and 0.5 s in float32 (docs/SPEED.md). The Trainer picks bf16 where the hardware has it, else float32.
    - `world_size` processes that hold the same parameters and, after data parallelism's all-reduce, the same
      gradients each orthogonalise their share of the matrices (`owners_of`), and one all-gather hands every process
      every update; torch's has each process iterate on every matrix. On 2 AVX2 cores in float32 the split took a
      step of the cram's model from 48% longer than AdamW's to 18% (docs/SPEED.md).
    - A weight that stacks several projections by rows (`row_blocks`, one count per parameter in the groups' order:
      `fused_row_blocks`) is orthogonalised and scaled block by block, as torch's would the separate matrices, the
      blocks in one batched product.
    Otherwise torch's arithmetic in torch's order (momentum, iterations, weight decay, step): in bf16 the parameters
    match torch's bit for bit, on one process or split, except that a fused weight's batched products may round
    otherwise than single ones (tests/test_optimizer.py)."""

    def __init__(self, params, iteration_dtype: torch.dtype = torch.bfloat16, rank: int = 0, world_size: int = 1,
                 row_blocks: list[int] | None = None, **settings):
        super().__init__(params, **settings)
        self.iteration_dtype, self.rank, self.world_size = iteration_dtype, rank, world_size
        # By position in the groups, as FSDP swaps the parameters for sharded ones in place; a property of the
        # architecture, rebuilt alike on resume, so not in the state dict.
        self.row_blocks = row_blocks

    def describe(self) -> str:
        split = f", split among {self.world_size} processes" if self.world_size > 1 else ""
        apart = ", fused weights by head and projection" if any(n > 1 for n in self.row_blocks or ()) else ""
        return f"Newton-Schulz iterations in {str(self.iteration_dtype).removeprefix('torch.')}{split}{apart}"

    @torch.no_grad()
    def step(self, closure=None):
        loss = loss_of(closure)
        # (group, parameter, Nesterov momentum, row blocks) of every matrix with a gradient: the same list on every
        # process
        todo, blocks = [], iter(self._row_blocks())
        for group in self.param_groups:
            for param in group["params"]:
                row_blocks = next(blocks)
                if param.grad is None:
                    continue
                state = self.state[param]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(param.grad, memory_format=torch.preserve_format)
                buffer, momentum = state["momentum_buffer"], group["momentum"]
                buffer.lerp_(param.grad, 1 - momentum)
                nesterov = param.grad.lerp(buffer, momentum) if group["nesterov"] else buffer
                todo.append((group, param, nesterov, row_blocks))
        updates = self._orthogonalised(todo)
        for (group, param, _, row_blocks), update in zip(todo, updates):
            lr = group["lr"]
            param.mul_(1 - lr * group["weight_decay"])
            param.add_(update, alpha=-lr * update_scale(group["adjust_lr_fn"], block_shape(param, row_blocks)))
        return loss

    def _row_blocks(self) -> list[int]:
        count = sum(len(group["params"]) for group in self.param_groups)
        if self.row_blocks is None:
            return [1] * count
        if len(self.row_blocks) != count:
            raise ValueError(f"Muon's row_blocks has {len(self.row_blocks)} entries for {count} parameters.")
        return self.row_blocks

    def _orthogonalised(self, todo: list) -> list[torch.Tensor]:
        """Each matrix's orthogonalised update (its shape, in iteration_dtype). Split: the process `owners_of` names
        computes it; each packs its own into one flat buffer, padded to the longest, and all-gathers those."""
        def iterate(group, param, update, row_blocks):  # a fused weight's blocks as one batch of matrices
            settings = (group["ns_coefficients"], group["ns_steps"], group["eps"], self.iteration_dtype)
            blocks = update.reshape(row_blocks, *block_shape(param, row_blocks)) if row_blocks > 1 else update
            return newton_schulz(blocks, *settings).reshape(param.shape)

        if self.world_size == 1:
            return [iterate(*work) for work in todo]
        owners = owners_of([iteration_cost(block_shape(param, n), n) for _, param, _, n in todo], self.world_size)
        starts, sizes = [], [0] * self.world_size  # each matrix's place in its owner's buffer; each buffer's length
        for (_, param, _, _), owner in zip(todo, owners):
            starts.append(sizes[owner])
            sizes[owner] += param.numel()
        mine = [iterate(*work) for work, owner in zip(todo, owners) if owner == self.rank]
        device = todo[0][1].device if todo else "cpu"
        flat = torch.zeros(max(sizes), dtype=self.iteration_dtype, device=device)
        if mine:
            flat[: sizes[self.rank]] = torch.cat([update.reshape(-1) for update in mine])
        gathered = [torch.empty_like(flat) for _ in range(self.world_size)]
        torch.distributed.all_gather(gathered, flat)
        return [gathered[owner][start : start + param.numel()].view(param.shape)
                for (_, param, _, _), owner, start in zip(todo, owners, starts)]


def newton_schulz(update: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float,
                  dtype: torch.dtype) -> torch.Tensor:
    """`update` (m, n), or a batch (blocks, m, n) of matrices each on its own -> its orthogonalisation in `dtype`:
    X <- aX + (bG + cG^2)X with G = XX^T, `steps` times, from X = update / its Frobenius norm, on the wide orientation
    (G is min(m, n) square). Jordan et al.'s quintic coefficients leave the singular values between about 0.7 and 1.2,
    not at 1, which trains as well. A matrix goes through torch's Muon's very operations; a batch through their
    batched forms, one product for all the blocks: with each layer's 12 query, key and value blocks batched, a step's
    iterations for the cram's model took 50-59 ms against 70-72 one block after another (docs/SPEED.md)."""
    a, b, c = coefficients
    batched = update.dim() == 3
    multiply_add = torch.baddbmm if batched else torch.addmm
    tall = update.size(-2) > update.size(-1)
    x = update.to(dtype).mT if tall else update.to(dtype)
    # not in place: in float32, .to() returned the momentum buffer itself
    x = x / (x.norm(dim=(1, 2), keepdim=True) if batched else x.norm()).clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.mT
        x = multiply_add(x, multiply_add(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.mT if tall else x


def update_scale(adjust_lr_fn: str | None, shape: tuple[int, int]) -> float:
    """What torch's Muon multiplies the learning rate by for a (rows, cols) matrix: match_rms_adamw's 0.2 x
    sqrt(max(rows, cols)) (Liu et al., 2025) or the original sqrt(max(1, rows / cols))."""
    rows, cols = shape
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    return math.sqrt(max(1, rows / cols))


def block_shape(param: torch.Tensor, row_blocks: int) -> tuple[int, int]:
    """The shape of each of the `row_blocks` matrices that `param` stacks by rows."""
    rows, cols = param.shape
    return rows // row_blocks, cols


def iteration_cost(shape: tuple[int, int], blocks: int = 1) -> int:
    """About what an iteration on `blocks` matrices of `shape` (m, n) costs: m^2 n each where m <= n."""
    return blocks * min(shape) ** 2 * max(shape)


def owners_of(costs: list[int], world_size: int) -> list[int]:
    """Which process orthogonalises each parameter, given each one's `iteration_cost`: the costliest first, each to
    the process with the least work so far. The same answer on every process."""
    load, owners = [0] * world_size, [0] * len(costs)
    for i in sorted(range(len(costs)), key=lambda i: -costs[i]):
        owners[i] = min(range(world_size), key=load.__getitem__)
        load[owners[i]] += costs[i]
    return owners
