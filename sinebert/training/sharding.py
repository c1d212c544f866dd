"""Fully sharded data parallel (FSDP 2) wherever `accelerate launch` runs with configs/accelerate/fsdp.yaml, CPUs
included.

On GPUs accelerate turns the launcher's FSDP settings into `DistributedType.FSDP` itself. On CPUs it keeps
`MULTI_CPU` and would train unsharded DDP without a word; torch's `fully_shard` runs over gloo all the same, so
`shard_on_cpu` gives accelerate's state the FSDP type and the launcher's plugin, and everything after it (sharding
each SineBertLayer, the reduce-scatter of gradients, sharded `save_state`/`load_state` through
torch.distributed.checkpoint, the full state dict for `save_pretrained`) is accelerate's own FSDP 2 path.
"""

import os
import pickle
from pathlib import Path

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
from torch import nn

from .errors import SharedUserError


def fsdp_requested() -> bool:
    """Whether the launcher was given an FSDP config (accelerate launch sets this from `distributed_type: FSDP`)."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


def check_cpu_fsdp_launch():
    """One sentence where FSDP on CPUs cannot run as the config is written: one process (nothing to shard across)
    or FSDP 1 (torch's FullyShardedDataParallel class, which accelerate drives on accelerators only)."""
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    if processes < 2:
        raise SharedUserError(
            "The launch config asks for FSDP, which shards the model across processes, but this launch has one "
            "process: pass --num_processes 2 or more, or launch without the FSDP config."
        )
    version = os.environ.get("FSDP_VERSION", "1")
    if version != "2":
        raise SharedUserError(
            f"The launch config asks for FSDP version {version}, which accelerate runs on GPUs only; set "
            "fsdp_version: 2 (as configs/accelerate/fsdp.yaml does) to shard on CPUs."
        )


def shard_on_cpu(accelerator: Accelerator):
    """Make a multi-process CPU accelerator an FSDP 2 one, with the plugin the launcher's FSDP_* variables describe.

    Both states are set: every `AcceleratorState()` made later copies `distributed_type` from `PartialState`."""
    plugin = FullyShardedDataParallelPlugin()
    if accelerator.mixed_precision != "no":
        plugin.set_mixed_precision(accelerator.mixed_precision)
    PartialState().distributed_type = DistributedType.FSDP
    accelerator.state.distributed_type = DistributedType.FSDP
    accelerator.state.fsdp_plugin = plugin


def is_sharded(accelerator: Accelerator) -> bool:
    return accelerator.distributed_type == DistributedType.FSDP


def full_state_dict(accelerator: Accelerator, model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole sharded model's weights on the CPU, in the main process (empty elsewhere); every process must call
    it, as the shards are gathered."""
    return accelerator.get_state_dict(model, unwrap=True)


def unsharded_copy(model: nn.Module, state: dict[str, torch.Tensor]) -> nn.Module:
    """A plain model of `model`'s own class (fully_shard swaps its class for a subclass, whose module
    `save_pretrained` would copy into the folder instead of sinebert's) holding the full weights `state`."""
    from torch.distributed.fsdp import FSDPModule

    cls = next(c for c in type(model).__mro__[1:] if not issubclass(c, FSDPModule))
    copy = cls(model.config)
    copy.load_state_dict(state)
    return copy


def load_full_state_dict(accelerator: Accelerator, model: nn.Module, state: dict[str, torch.Tensor]):
    """Give every process's shards of `model` the weights of `state`, which only the main process holds: each
    tensor is scattered from the main process into the model's own placement (every process must call this)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    with torch.no_grad():
        for name, target in model.state_dict().items():  # tensors sharing the parameters' storage
            full = state[name] if accelerator.is_main_process else torch.empty(target.shape)
            full = full.to(device=target.device, dtype=target.dtype)  # a GPU's shards are scattered from the GPU
            if isinstance(target, DTensor):
                target.copy_(distribute_tensor(full, target.device_mesh, target.placements, src_data_rank=0))
            else:
                torch.distributed.broadcast(full, src=0)
                target.copy_(full)


# torch.distributed.checkpoint writes its index of a sharded checkpoint (`.metadata`) as a plain pickle and reads
# it back with pickle.load, which would run any code a planted file holds. Before it does, the file is read here by
# an unpickler that can build only what that index is made of, and refused otherwise.
_METADATA_GLOBALS = {
    "torch.distributed.checkpoint.metadata": None,  # Metadata, TensorStorageMetadata, ChunkStorageMetadata, ...
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.distributed.checkpoint.planner": None,
    "pathlib": {"PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"},
    "torch.serialization": {"_get_layout"},
    "collections": {"OrderedDict"},
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        allowed = _METADATA_GLOBALS.get(module, set())
        is_torch_value = module == "torch" and (name == "Size" or isinstance(getattr(torch, name, None), torch.dtype))
        if not is_torch_value and (allowed is not None and name not in allowed):
            raise pickle.UnpicklingError(f"{module}.{name} is not part of a sharded checkpoint's index")
        return super().find_class(module, name)


def check_sharded_index(path: Path) -> str | None:
    """Why one of checkpoint `path`'s sharded-state indexes (`*/.metadata`) is not what torch.distributed.checkpoint
    writes, or None when there are none or all are."""
    for index in sorted(path.glob("*/.metadata")):
        try:
            with index.open("rb") as file:
                _MetadataUnpickler(file).load()
        except Exception as error:  # noqa: BLE001  (anything that is not a clean index)
            return f"{index} is not a sharded checkpoint's index ({type(error).__name__}: {str(error)[:120]})"
    return None
