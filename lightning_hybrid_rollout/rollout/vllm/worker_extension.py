"""The vLLM worker extension: the engine side of a weight update, inside vLLM's ``EngineCore`` / worker process.

vLLM mixes :class:`LHRWorkerExtension` into its worker because the driver names it in ``worker_extension_cls``
(:data:`~.driver.WORKER_EXTENSION_CLS`, a dotted path vLLM imports in the worker process); the driver calls its
``lhr_*`` methods with ``collective_rpc`` (:mod:`.weight_updates`). The worker maps the staging files the driver and
the trainer write (:mod:`lightning_hybrid_rollout.rollout.weights.staging`), parses zero-copy tensor views of each
bucket (:func:`~lightning_hybrid_rollout.rollout.weights.format.parse_safetensors`), hashes exactly what it feeds
to the loader under the trainer's names, and loads it: on CPU by the direct reload (:mod:`.direct_reload`) where it
is exact, elsewhere by vLLM's layer-wise in-place reload. At the end of an update it checks coverage (every model
parameter was written) and reads back what vLLM keeps materialized. An engine started with LoRA on takes adapter-only
updates instead: the received tensors become the engine's adapter (:mod:`.lora_adapter`), its base stays as loaded.
With ``rollout.weight_encoding: delta`` the worker keeps a dense copy of its weights (:class:`~lightning_hybrid_rollout.
rollout.weights.delta.DeltaShadow`): a delta is applied to it and the whole result is loaded at the finish, hashed like
a full sync.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import pickle
import resource
import time
from pathlib import Path
from typing import Any

import torch

from lightning_hybrid_rollout.rollout.vllm.direct_reload import DirectReload
from lightning_hybrid_rollout.rollout.vllm.lora_adapter import WorkerAdapter
from lightning_hybrid_rollout.rollout.weights.delta import DeltaShadow
from lightning_hybrid_rollout.rollout.weights.format import (
    checksum_state,
    combine_digests,
    parse_safetensors,
    tensor_digest,
)


def _expected_param(pname: str, received: dict[str, torch.Tensor], packed: dict[str, list[str]]) -> torch.Tensor | None:
    """The HF tensor(s) a vLLM parameter should equal (fused projections are concatenated on dim 0)."""
    if pname in received:
        return received[pname]
    prefix, _, leaf = pname.rpartition(".")
    mod_prefix, _, mod = prefix.rpartition(".")
    parts = packed.get(mod)
    if not parts:
        return None
    pieces = [received.get(f"{mod_prefix}.{p}.{leaf}" if mod_prefix else f"{p}.{leaf}") for p in parts]
    if any(x is None for x in pieces):
        return None
    return torch.cat(pieces, dim=0)  # type: ignore[arg-type]


class LHRWorkerExtension:
    """Methods mixed into vLLM's worker (``worker_extension_cls``), called via ``collective_rpc("lhr_*")``.

    Its state (set by :meth:`lhr_init` and the attach / update calls; ``_lhr_`` keeps it apart from vLLM's):
    ``_lhr_mm`` / ``_lhr_node_mm`` (the driver's staging file / the trainer's node staging file, mapped),
    ``_lhr_update`` (the update in progress), ``_lhr_direct`` (the direct reload, where it is exact), ``_lhr_fp``
    (the parameter fingerprint at the last verified load), ``_lhr_adapter`` (the LoRA adapter of an
    adapter-synced engine, else None) and ``_lhr_shadow`` (the dense weights a delta is applied to).
    """

    _lhr_mm: mmap.mmap | None
    _lhr_node_mm: mmap.mmap | None
    _lhr_update: dict[str, Any] | None
    _lhr_direct: DirectReload | None
    _lhr_fp: dict[str, str]
    _lhr_adapter: WorkerAdapter | None
    _lhr_shadow: DeltaShadow

    # ---- helpers --------------------------------------------------------------------------------------------------
    def _lhr_model(self) -> torch.nn.Module:
        return self.model_runner.get_model()  # type: ignore[attr-defined]

    def _lhr_fingerprint(self) -> dict[str, str]:
        adapter = getattr(self, "_lhr_adapter", None)
        out = adapter.fingerprint(self.model_runner) if adapter is not None else {}  # type: ignore[attr-defined]
        for name, p in self._lhr_model().named_parameters():
            if p.numel() == 0 or p.is_meta:
                continue
            if p.device.type == "cpu":
                out[name] = tensor_digest(name, p.detach())
            else:  # GPU: cheap device-side moments instead of copying every weight to the host
                v = p.detach().reshape(-1).double()
                idx = torch.arange(1, v.numel() + 1, device=v.device, dtype=torch.float64)
                out[name] = f"{v.sum().item():.17g}/{(v * v).sum().item():.17g}/{(v * idx).sum().item():.17g}"
        return out

    def _lhr_readback(self, received: dict[str, torch.Tensor]) -> tuple[int, int, list[str]]:
        model = self._lhr_model()
        packed = dict(getattr(model, "packed_modules_mapping", {}) or {})
        verified, skipped, bad = 0, 0, []
        first: dict[int, str] = {}
        # every name of a tied parameter (lm_head tied to embed_tokens): what the trainer sent under each must agree
        for name, p in model.named_parameters(remove_duplicate=False):
            canonical = first.setdefault(id(p), name)
            if p.numel() == 0 or p.is_meta:
                skipped += 1
                continue
            exp = _expected_param(name, received, packed)
            if exp is None:
                skipped += 1
                continue
            got = p.detach().cpu()
            if got.shape != exp.shape and got.dim() == exp.dim() and got.shape[1:] == exp.shape[1:]:
                got = got[: exp.shape[0]]  # vocab padding
            if got.shape != exp.shape or not torch.equal(got, exp.to(got.dtype)):
                bad.append(name if canonical == name else f"{name} (tied to {canonical})")
            else:
                verified += 1
        return verified, skipped, bad

    # ---- rpc methods ----------------------------------------------------------------------------------------------
    def lhr_init(self, verify: bool, direct_reload: bool = True, lora: dict[str, Any] | None = None) -> dict[str, Any]:
        """Engine pid + (optionally) the checksum of the checkpoint on disk, read back against the engine.

        ``lora``: the adapter's PEFT fields; every update of this engine is then an adapter-only one."""
        out: dict[str, Any] = {"pid": os.getpid(), "checksum": None}
        # the trainer casts a delta's tensors to this dtype (what the engine holds), so a delta is exact
        out["dtype"] = str(self.vllm_config.model_config.dtype).removeprefix("torch.")  # type: ignore[attr-defined]
        self._lhr_shadow = DeltaShadow()
        self._lhr_mm = None
        self._lhr_update = None
        self._lhr_adapter = WorkerAdapter(lora) if lora is not None else None
        direct_reload = direct_reload and lora is None  # the base of an adapter-synced engine is never reloaded
        model_dir = Path(self.vllm_config.model_config.model)  # type: ignore[attr-defined]
        files = sorted(model_dir.glob("*.safetensors")) if model_dir.is_dir() else []
        out["checkpoint_bytes"] = sum(f.stat().st_size for f in files)
        self._lhr_direct = None
        if direct_reload and files:
            from safetensors import safe_open

            names: set[str] = set()
            for f in files:
                with safe_open(str(f), framework="pt") as fh:
                    names.update(fh.keys())
            self._lhr_direct = DirectReload.plan(self._lhr_model(), names)
        out["direct_reload"] = self._lhr_direct is not None
        if verify:
            from safetensors.torch import load_file

            if files:
                tensors: dict[str, torch.Tensor] = {}
                for f in files:
                    tensors.update(load_file(str(f)))
                out["checksum"] = checksum_state(tensors)
                verified, _, bad = self._lhr_readback(tensors)
                if bad:
                    raise RuntimeError(f"engine parameters differ from the checkpoint on disk: {bad[:5]}")
                out["readback_verified"] = verified
        self._lhr_fp = self._lhr_fingerprint()
        return out

    def _lhr_map(self, attr: str, path: str, size: int) -> bool:
        """Map ``path`` read-write into ``self.<attr>``, closing the mapping it replaces."""
        old = getattr(self, attr, None)
        if old is not None:
            with contextlib.suppress(BufferError):
                old.close()
        fd = os.open(path, os.O_RDWR)
        try:
            setattr(self, attr, mmap.mmap(fd, size))
        finally:
            os.close(fd)
        return True

    def lhr_attach_staging(self, path: str, size: int) -> bool:
        """Map the frontend's staging file (the frontend unlinks the name right after)."""
        return self._lhr_map("_lhr_mm", path, size)

    def lhr_attach_node_staging(self, path: str, size: int) -> bool:
        """Map the trainer's node-local staging file (shared, not copied: the trainer wrote the buckets once)."""
        return self._lhr_map("_lhr_node_mm", path, size)

    def lhr_begin_update(self) -> bool:
        """Start a layer-wise in-place reload session."""
        from vllm.model_executor.model_loader.reload.layerwise import initialize_layerwise_reload

        model = self._lhr_model()
        self._lhr_update = {
            "params": {n for n, _ in model.named_parameters()},
            "loaded": set(),
            "digests": {},
            "received": {},
            "keep": [],
            "t0": time.perf_counter(),
            "mode": "adapter"
            if getattr(self, "_lhr_adapter", None) is not None
            else "direct"
            if getattr(self, "_lhr_direct", None)
            else "layerwise",
            "load_s": 0.0,
            "hash_s": 0.0,
            "delta_s": 0.0,
            "minflt0": resource.getrusage(resource.RUSAGE_SELF).ru_minflt,
        }
        if self._lhr_update["mode"] == "layerwise":
            initialize_layerwise_reload(model)
        self._lhr_delta().begin()
        return True

    def _lhr_delta(self) -> DeltaShadow:
        shadow = getattr(self, "_lhr_shadow", None)
        if shadow is None:
            shadow = self._lhr_shadow = DeltaShadow()
        return shadow

    def _lhr_feed(self, items: list[tuple[str, torch.Tensor]], source: Any = None) -> dict[str, Any]:
        """Hash the received tensors, remember them for the read-back, and load them (direct or layer-wise).

        ``source``: the buffer the tensors are views of (lets the direct reload pack a fused projection from its
        adjacent parts without concatenating them first).
        """
        if self._lhr_update is None:
            raise RuntimeError("weights arrived without lhr_begin_update")
        # a delta-encoded run's header and tensors: a full payload is kept as the shadow and loaded now, a delta
        # is applied to the shadow and loaded at the finish (nothing to load now)
        t = time.perf_counter()
        items = self._lhr_delta().take(items)
        self._lhr_update["delta_s"] += time.perf_counter() - t
        if not items:
            return {"tensors": 0}
        return self._lhr_load(items, source)

    def _lhr_load(self, items: list[tuple[str, torch.Tensor]], source: Any = None) -> dict[str, Any]:
        """:meth:`_lhr_feed` past the delta: hash, remember and load ``items``."""
        from vllm.config import set_current_vllm_config

        upd = self._lhr_update
        assert upd is not None
        t = time.perf_counter()
        for name, tensor in items:
            if name in upd["digests"]:
                raise RuntimeError(f"tensor {name!r} arrived twice in one update")
            upd["digests"][name] = tensor_digest(name, tensor)
            upd["received"][name] = tensor
        upd["hash_s"] += time.perf_counter() - t
        if upd["mode"] == "adapter":  # built at the finish, from copies (the views' staging file is reused)
            for name, tensor in items:
                upd["received"][name] = tensor.detach().to("cpu", copy=True)
            return {"tensors": len(items)}
        t = time.perf_counter()
        with set_current_vllm_config(self.vllm_config), torch.no_grad():  # type: ignore[attr-defined]
            if upd["mode"] == "direct":
                assert self._lhr_direct is not None
                loaded = self._lhr_direct.load(self._lhr_model(), items, source)
            else:
                loaded = self._lhr_model().load_weights(items)
        upd["load_s"] += time.perf_counter() - t
        if loaded is None:
            upd["loaded"] = None
        elif upd["loaded"] is not None:
            upd["loaded"].update(loaded)
        return {"tensors": len(items)}

    def lhr_load_bucket(self, offset: int, nbytes: int, source: str = "staging") -> dict[str, Any]:
        """Load the safetensors blob at ``offset`` of a staging file (zero-copy views) into the model.

        ``source``: ``"staging"`` (this engine's own file, written by its frontend) or ``"node"`` (the trainer's
        node-local file).
        """
        mm = self._lhr_mm if source == "staging" else getattr(self, "_lhr_node_mm", None)
        if self._lhr_update is None or mm is None:
            raise RuntimeError(f"lhr_load_bucket without lhr_begin_update / {source} staging")
        items, size = parse_safetensors(mm, offset)
        if size != nbytes:
            raise RuntimeError(f"bucket at {offset}: header says {size} bytes, frontend wrote {nbytes}")
        return {**self._lhr_feed(items, mm), "bytes": nbytes}

    def lhr_load_spans(self, spans: list[tuple[int, int]], source: str = "node") -> dict[str, Any]:
        """Load several buckets of a staging file (``"node"``: the trainer's; ``"staging"``: this engine's) in one
        RPC."""
        tensors = nbytes = 0
        for offset, n in spans:
            info = self.lhr_load_bucket(offset, n, source)
            tensors += info["tensors"]
            nbytes += info["bytes"]
        return {"tensors": tensors, "bytes": nbytes, "buckets": len(spans)}

    def lhr_receive(self, transport: str, blob: bytes) -> dict[str, Any]:
        """Hand a pickled :data:`~lightning_hybrid_rollout.rollout.weights.base.TransferRequest` to this worker's
        receiver of ``transport`` (made on first use); load the tensors it returns (kept alive until the update
        ends: the layer-wise reload may read them late)."""
        from lightning_hybrid_rollout.rollout.weights.factory import create_receiver

        receivers = getattr(self, "_lhr_receivers", None)
        if receivers is None:
            receivers = self._lhr_receivers = {}
        if transport not in receivers:
            receivers[transport] = create_receiver(transport)
        items = receivers[transport].receive(pickle.loads(blob))
        if not items:
            return {"tensors": 0}
        info = self._lhr_feed(items)
        self._lhr_update["keep"].append(items)  # type: ignore[index]
        return info

    def lhr_close_receivers(self) -> bool:
        """Release every transport receiver (e.g. leave the broadcast group)."""
        for rx in (getattr(self, "_lhr_receivers", None) or {}).values():
            with contextlib.suppress(Exception):
                rx.close()
        self._lhr_receivers = {}
        return True

    def lhr_finish_update(self) -> dict[str, Any]:
        """Finalize the reload, check coverage and read-back; returns the checksum (or ``error``)."""
        from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

        upd = self._lhr_update
        if upd is None:
            raise RuntimeError("lhr_finish_update without lhr_begin_update")
        shadow = self._lhr_delta()
        delta_error = None
        if upd["mode"] != "adapter":
            try:  # a delta's result: the whole updated shadow, loaded (and hashed) as a full sync would be
                pending = shadow.pending()
                if pending:
                    self._lhr_load(pending)
            except Exception as e:  # the loader refused it: the update fails below, the shadow is dropped
                delta_error = f"loading the delta-updated weights failed: {type(e).__name__}: {e}"
        self._lhr_update = None
        if upd["mode"] == "adapter":
            return self._lhr_finish_adapter(upd)
        model = self._lhr_model()
        if upd["mode"] == "layerwise":
            finalize_layerwise_reload(model, self.vllm_config.model_config)  # type: ignore[attr-defined]
        runner = self.model_runner  # type: ignore[attr-defined]
        for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):
            fn = getattr(runner, reset, None)
            if fn is not None:
                with contextlib.suppress(Exception):
                    fn()
        out: dict[str, Any] = {
            "tensors": len(upd["digests"]),
            "params": len(upd["params"]),
            "mode": upd["mode"],
            "load_s": upd["load_s"],
            "hash_s": upd["hash_s"],
            "delta_s": upd["delta_s"],
            "page_faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - upd["minflt0"],
        }
        errors = []
        if upd["loaded"] is not None:
            missing = sorted(upd["params"] - upd["loaded"])
            if missing:
                errors.append(
                    f"{len(missing)} model parameter(s) got no new weights (vLLM kept the old values): {missing[:5]}"
                )
        verified, skipped, bad = self._lhr_readback(upd["received"])
        out["readback_verified"], out["readback_skipped"] = verified, skipped
        if bad:
            errors.append(f"read-back mismatch after load for {len(bad)} parameter(s): {bad[:5]}")
        out["checksum"] = combine_digests(upd["digests"])
        out["encoding"], out["delta_elements"] = shadow.mode or "full", shadow.changed
        if delta_error is not None:
            errors.append(delta_error)
        if errors:
            shadow.abandon()
        else:
            shadow.commit(out["checksum"])
        upd["received"].clear()
        upd["keep"].clear()
        self._lhr_fp = self._lhr_fingerprint()
        if errors:
            out["error"] = "; ".join(errors)
        return out

    def _lhr_finish_adapter(self, upd: dict[str, Any]) -> dict[str, Any]:
        """The finish of an adapter-only update: install the adapter, read its slot back, return the checksum."""
        adapter = self._lhr_adapter
        assert adapter is not None
        t = time.perf_counter()
        out: dict[str, Any] = {"tensors": len(upd["digests"]), "mode": "adapter", "hash_s": upd["hash_s"]}
        errors = []
        if not upd["received"]:
            errors.append("an adapter-only update brought no tensors")
        else:
            try:
                got = adapter.install(self.model_runner, upd["received"])  # type: ignore[attr-defined]
            except Exception as e:  # vLLM refused the tensors: the previous adapter still serves
                errors.append(f"vLLM refused the adapter: {type(e).__name__}: {e}")
            else:
                out["readback_verified"] = got["readback_verified"]
                if got["bad"]:
                    errors.append(f"adapter read-back mismatch for {len(got['bad'])} tensor(s): {got['bad'][:5]}")
                if got["unplaced"]:
                    errors.append(
                        f"{len(got['unplaced'])} adapter tensor(s) match no LoRA layer of the engine: "
                        f"{got['unplaced'][:5]}"
                    )
        out["load_s"] = time.perf_counter() - t
        out["checksum"] = combine_digests(upd["digests"])
        upd["received"].clear()
        self._lhr_fp = self._lhr_fingerprint()
        if errors:
            out["error"] = "; ".join(errors)
        return out

    def lhr_abort_update(self) -> bool:
        """Finalize a half-done reload (layers that got nothing keep their old tensors)."""
        from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

        upd = getattr(self, "_lhr_update", None)
        if upd is None:
            return False
        self._lhr_update = None
        self._lhr_delta().abandon()
        if upd["mode"] == "layerwise":
            finalize_layerwise_reload(self._lhr_model(), self.vllm_config.model_config)  # type: ignore[attr-defined]
        return True

    def lhr_check_fingerprint(self) -> dict[str, Any]:
        """Compare the materialized parameters with the fingerprint recorded at the last verified load."""
        now = self._lhr_fingerprint()
        before = getattr(self, "_lhr_fp", None)
        if before is None:
            return {"ok": True, "params": len(now), "note": "no fingerprint recorded"}
        changed = sorted(k for k in set(now) | set(before) if now.get(k) != before.get(k))
        return {"ok": not changed, "params": len(now), "changed": changed[:10]}
