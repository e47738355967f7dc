"""Python client of refitd: trainers push torch tensors, engines register theirs.

    import refit
    refit.TrainerClient(address).refit(model_name, model.named_parameters())   # trainer
    engine = refit.ModuleEngine(address, model)                                # engine (CPU)
    engine = refit.GatedEngine(address, refit.CudaParams.from_tensors(t, "cuda:1").params)  # CUDA IPC
    refit.distributed.refit(group, client, model_name, my_shards)     # every rank of a torch.distributed group

See docs/python.md. The package binds librefit_client.so's C ABI with ctypes (refit._native
says how the library is found).
"""
from .cuda import CudaParam, CudaParams, CudaPtrParam, InPlaceParams
from .engine import EngineAgent, GatedEngine, InPlaceEngine, ModuleEngine
from .errors import (RefitAborted, RefitBusy, RefitDataLoss, RefitDeadlineExceeded, RefitEngineDirty, RefitError,
                     RefitInternal, RefitInvalidArgument, RefitNotFound, RefitOverloaded, RefitRefused,
                     RefitUnavailable, RefitUnimplemented, RefitVerifyMismatch, WeightsDirty)
from .shm import SharedParams, ShmParam, move_to_shm
from .trainer import DaemonStatus, GroupStatus, RefitReport, RefitSession, StagedVersion, TrainerClient, checksum
from . import distributed, megatron

__version__ = "0.1.0"

__all__ = [
    "EngineAgent", "GatedEngine", "InPlaceEngine", "ModuleEngine", "CudaParam", "CudaParams", "CudaPtrParam",
    "InPlaceParams", "SharedParams", "ShmParam", "move_to_shm", "TrainerClient", "RefitSession",
    "RefitReport", "DaemonStatus", "GroupStatus", "StagedVersion", "checksum", "RefitError", "RefitInvalidArgument", "RefitRefused",
    "RefitUnavailable", "RefitBusy", "RefitEngineDirty", "RefitAborted", "RefitDeadlineExceeded", "RefitOverloaded",
    "RefitDataLoss", "RefitVerifyMismatch", "RefitNotFound", "RefitInternal", "RefitUnimplemented", "WeightsDirty",
    "distributed", "megatron",
]
