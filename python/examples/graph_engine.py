"""A rollout engine as serving stacks build one: a transformers Llama whose decode step is captured
in CUDA graphs over a static KV cache, weights refitd writes in place, and sleep/wake between
rollouts.

  * Weights: the FP8 engine of llama_fp8 (projections are Fp8Linear over e4m3 bytes and float32
    block scales, everything else BF16). register_engine_params() is the one place that decides
    how they become refitd-registered CUDA memory; the model's parameters and buffers are pointed
    at its views BEFORE capture, so the graphs read what refitd writes and are never re-captured.
  * Decode step: one token per sequence at position `pos` (a device tensor), through the
    model's own modules (embed_tokens, input/post_attention layernorms, q/k/v/o projections,
    mlp, norm, lm_head; rotary tables from its rotary_emb), attention over a static KV cache with
    positions > pos masked. Every shape is static and nothing reads a device value on the host,
    so the step captures as-is; one CUDAGraph per batch size, sharing one memory pool. Prompts
    are fed through the same graph, one position per replay.
  * KV cache: one pool (`kv_pool_bytes`, the caches are carved from its start, the rest stands
    for the free blocks an engine keeps) in CUDA virtual memory (cuMemAddressReserve + cuMemCreate
    + cuMemMap through the driver API). sleep() unmaps and releases its physical memory and
    empties torch's cache; wake() maps fresh physical memory at the SAME virtual addresses, so the
    captured graphs stay valid. The weights, when registered as VmmWeights, are released and
    mapped again the same way around refitd's sleep/wake; the graphs' private pool stays (it is
    what keeps them valid).

Threading: one thread drives capture, generate, sleep and wake; refitd's pause/resume come on
the engine agent's thread and are gated by GatedEngine.serving() around each generation.
"""
from __future__ import annotations

import ctypes

import torch


# ---- Registration -------------------------------------------------------------------------


def register_engine_params(tensors: dict, device, dtypes: dict, release_weights: bool = False):
    """The engine's tensors (name -> tensor of the engine table) as refitd-registered memory:
    (the store that owns it, the parameter list to register, {name: the tensor the model must
    use}); the model is pointed at the returned views before capture.

    On the GPU with `release_weights`: one CUDA virtual-memory buffer shareable as a POSIX file
    descriptor (VmmWeights), the values copied in once and the views registered in place, so
    sleep can release the weights' physical memory and wake maps new memory at the same
    addresses. Otherwise one ordinary allocation (refit.CudaParams.from_tensors) on the GPU, or
    POSIX shared memory (refit.SharedParams) on the host."""
    import refit

    if torch.device(device).type != "cuda":  # host runs of the same flow: POSIX shared memory
        store = refit.SharedParams.from_tensors(tensors, dtypes=dtypes)
    elif release_weights:
        store = VmmWeights(tensors, torch.device(device).index, dtypes)
    else:
        store = refit.CudaParams.from_tensors(tensors, device, dtypes=dtypes)
    return store, store.params, store.tensors


class VmmWeights:
    """The engine's weights in one VmmBuffer (shareable: refitd maps it through the file
    descriptor the engine agent sends), each tensor 256-byte aligned, registered in place.
    release() gives the physical memory back (after the agent's sleep, which makes refitd drop
    its mapping); map() maps new memory at the same addresses, whose contents are undefined until
    refitd writes a whole refit into them (the wake commits the refit staged while asleep)."""

    ALIGN = 256

    def __init__(self, tensors: dict, device: int, dtypes: dict):
        import refit

        offsets, total = {}, 0
        for name, t in tensors.items():
            offsets[name] = total
            total += (t.numel() * t.element_size() + self.ALIGN - 1) // self.ALIGN * self.ALIGN
        self.buffer = VmmBuffer(total, device, shareable=True)
        self.tensors = {}
        for name, t in tensors.items():
            n = t.numel() * t.element_size()
            view = self.buffer.tensor[offsets[name]:offsets[name] + n].view(t.dtype).view(t.shape)
            view.copy_(t.to(view.device))
            self.tensors[name] = view
        torch.cuda.synchronize(device)
        self.in_place = refit.CudaParams.in_place(self.tensors, dtypes)
        self.params = self.in_place.params

    @property
    def mapped(self) -> bool:
        return self.buffer.mapped

    @property
    def nbytes(self) -> int:
        return self.buffer.nbytes

    def release(self):
        torch.cuda.synchronize(self.buffer.device)
        self.buffer.release()

    def map(self):
        self.buffer.map()


# ---- CUDA virtual memory (driver API) -----------------------------------------------------


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


_PINNED, _DEVICE, _READWRITE, _POSIX_FD = 1, 1, 3, 1
_driver = None


def _cu():
    global _driver
    if _driver is None:
        _driver = ctypes.CDLL("libcuda.so.1")
    return _driver


def _check(rc, what):
    if rc != 0:
        name = ctypes.c_char_p()
        _cu().cuGetErrorName(rc, ctypes.byref(name))
        raise RuntimeError(f"{what}: CUDA driver error {rc} ({(name.value or b'?').decode()})")


class _Cai:
    """__cuda_array_interface__ of raw device bytes, so torch.as_tensor can view them."""

    def __init__(self, ptr, nbytes):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 2}


class VmmBuffer:
    """`nbytes` (rounded up to the granularity) of device memory at a virtual address reserved
    once; release() gives the physical memory back, map() maps new physical memory at the same
    address. `.tensor` (uint8) views it; its contents are undefined after each map()."""

    def __init__(self, nbytes: int, device: int, shareable: bool = False):
        cu = _cu()
        self.device = device
        self.prop = _AllocProp()
        self.prop.type, self.prop.location.type, self.prop.location.id = _PINNED, _DEVICE, device
        if shareable:  # exportable as a POSIX file descriptor (what refitd maps)
            self.prop.requestedHandleTypes = _POSIX_FD
        gran = ctypes.c_size_t()
        _check(cu.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(self.prop), 0), "granularity")
        self.nbytes = (nbytes + gran.value - 1) // gran.value * gran.value
        self.ptr = ctypes.c_uint64()
        _check(cu.cuMemAddressReserve(ctypes.byref(self.ptr), ctypes.c_size_t(self.nbytes), ctypes.c_size_t(0),
                                      ctypes.c_uint64(0), ctypes.c_ulonglong(0)), "cuMemAddressReserve")
        self.handle = None
        self.map()
        self.tensor = torch.as_tensor(_Cai(self.ptr.value, self.nbytes), device=torch.device("cuda", device))
        assert self.tensor.data_ptr() == self.ptr.value

    @property
    def mapped(self) -> bool:
        return self.handle is not None

    def map(self):
        if self.handle is not None:
            return
        cu = _cu()
        handle = ctypes.c_ulonglong()
        _check(cu.cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(self.nbytes), ctypes.byref(self.prop),
                              ctypes.c_ulonglong(0)), f"cuMemCreate({self.nbytes})")
        _check(cu.cuMemMap(ctypes.c_uint64(self.ptr.value), ctypes.c_size_t(self.nbytes), ctypes.c_size_t(0), handle,
                           ctypes.c_ulonglong(0)), "cuMemMap")
        access = _AccessDesc()
        access.location.type, access.location.id, access.flags = _DEVICE, self.device, _READWRITE
        _check(cu.cuMemSetAccess(ctypes.c_uint64(self.ptr.value), ctypes.c_size_t(self.nbytes), ctypes.byref(access),
                                 ctypes.c_size_t(1)), "cuMemSetAccess")
        self.handle = handle

    def release(self):
        """REQUIRES: no queued kernel reads or writes the buffer (synchronize first)."""
        if self.handle is None:
            return
        cu = _cu()
        _check(cu.cuMemUnmap(ctypes.c_uint64(self.ptr.value), ctypes.c_size_t(self.nbytes)), "cuMemUnmap")
        _check(cu.cuMemRelease(self.handle), "cuMemRelease")
        self.handle = None


class TorchBuffer:
    """The same interface over an ordinary torch allocation (CPU runs, reference engines): release()
    keeps the memory (a torch allocation cannot keep its address across a free)."""

    def __init__(self, nbytes: int, device):
        self.nbytes = nbytes
        self.tensor = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        self.mapped = True

    def map(self):
        pass

    def release(self):
        pass


# ---- The decode step ----------------------------------------------------------------------


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class GraphEngine:
    """Greedy decoding of `model` (a LlamaForCausalLM, eval, on a CUDA device or the CPU) through
    a static-KV decode step; `capture()` records it in one CUDA graph per batch size in
    `batch_sizes` (CUDA only; on the CPU generate() runs the same step eagerly)."""

    def __init__(self, model, max_len: int, batch_sizes=(1, 2), kv_pool_bytes: int = 0, vmm: bool = False):
        self.model = model
        cfg = model.config
        self.device = next(model.parameters()).device
        self.dtype = model.model.embed_tokens.weight.dtype
        self.layers = list(model.model.layers)
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.groups = self.heads // self.kv_heads
        self.scaling = self.head_dim ** -0.5
        self.max_len = max_len
        self.batch_sizes = sorted(batch_sizes, reverse=True)
        bmax = self.batch_sizes[0]
        self.cache_shape = (bmax, self.kv_heads, max_len, self.head_dim)
        per = bmax * self.kv_heads * max_len * self.head_dim * torch.empty((), dtype=self.dtype).element_size()
        self.cache_bytes = 2 * len(self.layers) * per
        pool = max(kv_pool_bytes, self.cache_bytes)
        self.kv_error = None
        self.kv = None
        if vmm and self.device.type == "cuda":
            try:
                self.kv = VmmBuffer(pool, self.device.index)
            except Exception as e:  # no virtual memory management here: an ordinary allocation
                self.kv_error = f"{type(e).__name__}: {e}"
        if self.kv is None:
            self.kv = TorchBuffer(pool, self.device)
        self.kv_is_vmm = isinstance(self.kv, VmmBuffer)
        caches = self.kv.tensor[:self.cache_bytes].view(self.dtype).view(len(self.layers), 2, *self.cache_shape)
        self.k_cache = [caches[i, 0] for i in range(len(self.layers))]
        self.v_cache = [caches[i, 1] for i in range(len(self.layers))]
        self._caches = caches
        # Static inputs and rotary tables (the model's rotary_emb at every position).
        self.tokens = torch.zeros(bmax, 1, dtype=torch.long, device=self.device)
        self.pos = torch.zeros(1, dtype=torch.long, device=self.device)
        self.positions = torch.arange(max_len, device=self.device)
        with torch.no_grad():
            probe = torch.zeros(1, max_len, self.head_dim, dtype=self.dtype, device=self.device)
            cos, sin = model.model.rotary_emb(probe, self.positions[None])
        self.cos, self.sin = cos[0], sin[0]  # [max_len, head_dim]
        self.graphs: dict = {}
        self.outputs: dict = {}
        self.captures = 0
        self.pool = None

    # One token per sequence at self.pos, for the first `b` sequences.
    def step(self, b: int) -> torch.Tensor:
        m = self.model.model
        pos = self.pos
        x = m.embed_tokens(self.tokens[:b])  # [b, 1, hidden]
        cos = self.cos.index_select(0, pos)[None, None]  # [1, 1, 1, head_dim]
        sin = self.sin.index_select(0, pos)[None, None]
        hidden = self.positions > pos  # [max_len]: not yet written
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(b, 1, self.heads, self.head_dim).transpose(1, 2)
            k = attn.k_proj(h).view(b, 1, self.kv_heads, self.head_dim).transpose(1, 2)
            v = attn.v_proj(h).view(b, 1, self.kv_heads, self.head_dim).transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            kc, vc = self.k_cache[i][:b], self.v_cache[i][:b]
            kc.index_copy_(2, pos, k)
            vc.index_copy_(2, pos, v)
            keys, values = self._repeat_kv(kc, b), self._repeat_kv(vc, b)  # [b, heads, max_len, head_dim]
            w = torch.matmul(q, keys.transpose(2, 3)) * self.scaling  # [b, heads, 1, max_len]
            w = w.masked_fill(hidden, float("-inf"))
            w = torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
            o = torch.matmul(w, values).transpose(1, 2).reshape(b, 1, self.heads * self.head_dim)
            x = x + attn.o_proj(o)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.model.lm_head(m.norm(x))[:, 0].float()  # [b, vocab]

    def _repeat_kv(self, c, b):
        """Each KV head for its `groups` query heads (transformers' repeat_kv)."""
        return c[:, :, None].expand(b, self.kv_heads, self.groups, self.max_len, self.head_dim).reshape(
            b, self.heads, self.max_len, self.head_dim)

    @torch.no_grad()
    def capture(self):
        """Records step(b) for every batch size (after warm-up runs on a side stream)."""
        if self.device.type != "cuda":
            raise RuntimeError("CUDA graphs need a CUDA device")
        self.reset()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for b in self.batch_sizes:
                for _ in range(2):
                    self.step(b)
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.pool = torch.cuda.graph_pool_handle()
        for b in self.batch_sizes:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.pool):
                self.outputs[b] = self.step(b)
            self.graphs[b] = g
            self.captures += 1
        torch.cuda.synchronize(self.device)
        self.reset()

    def reset(self):
        """Clears the KV cache (a remapped pool holds arbitrary bytes, and 0 * NaN is NaN)."""
        self._caches.zero_()

    def _run(self, b: int) -> torch.Tensor:
        if self.graphs:
            self.graphs[b].replay()
            return self.outputs[b]
        return self.step(b)

    @torch.no_grad()
    def generate(self, prompts, new_tokens: int):
        """Greedy: (token ids [b, len + new_tokens] on the CPU, float32 logits of every generated
        step [new_tokens, b, vocab] on the CPU). Prompts: equal-length lists of ids."""
        b, n = len(prompts), len(prompts[0])
        if n + new_tokens > self.max_len:
            raise ValueError(f"{n} + {new_tokens} tokens exceed the cache's {self.max_len}")
        prompt = torch.tensor(prompts, dtype=torch.long, device=self.device)
        self.reset()
        steps, out = [], [prompt]
        nxt = None
        for t in range(n + new_tokens - 1):
            self.tokens[:b].copy_(prompt[:, t:t + 1] if t < n else nxt)
            self.pos.fill_(t)
            logits = self._run(b)
            if t >= n - 1:
                steps.append(logits.clone())
                nxt = logits.argmax(dim=-1, keepdim=True)
                out.append(nxt)
        return torch.cat(out, dim=1).cpu(), torch.stack(steps).cpu()

    def tensor_ptrs(self) -> dict:
        """{name: data_ptr} of every parameter and buffer the graphs read."""
        named = dict(self.model.named_parameters())
        named.update(dict(self.model.named_buffers()))
        return {n: t.data_ptr() for n, t in named.items()}

    def sleep(self):
        """Releases the KV pool's physical memory (VMM) and torch's cached blocks."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.kv.release()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def wake(self):
        """Maps the KV pool again, at the same addresses; the graphs are replayable as they are."""
        self.kv.map()
        self.reset()

    def resident_bytes(self) -> dict:
        """What this process holds on the device: torch's reserved memory (weights, graph pool,
        anything cached) and the mapped KV pool."""
        torch_reserved = int(torch.cuda.memory_reserved(self.device)) if self.device.type == "cuda" else 0
        kv = self.kv.nbytes if (self.kv_is_vmm and self.kv.mapped) else 0  # else inside torch_reserved
        return {"torch_reserved": torch_reserved, "kv_pool_mapped": kv, "total": torch_reserved + kv}
