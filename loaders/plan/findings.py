"""What the simulator found, as data (tests compare) and as text (users read). Pure."""
from __future__ import annotations

from dataclasses import dataclass, field

from ...parallel.units import format_gib

__all__ = ["DeviceReport", "SimulationReport", "device_report"]

NOT_MODELLED = ("not counted: the CUDA context (~0.5 GiB per GPU), allocator fragmentation, cuBLAS "
                "workspaces, the text encoder and the VAE; leave room with --reserve-vram-gb")


@dataclass
class DeviceReport:
    """One device in the simulated forward (bytes)."""

    device: str
    name: str
    total: int
    free: int
    usable: int | None
    """Free (+ held by ShardDiT) minus reserve; available RAM for cpu; None when unknown."""
    weights: int
    """Parameters and buffers placed there (measured on the fake device)."""
    peak_activations: int
    """Peak of live non-weight storages there during the forward."""
    blocks: list = field(default_factory=list)
    home: bool = False
    """Holds the DiT's non-block part (embeddings, head); the hidden state starts and ends here."""
    prefetch: int = 0
    """Buffers for blocks streamed from their owners (`sequence` mode), beside the activations."""

    @property
    def need(self) -> int:
        return self.weights + self.peak_activations + self.prefetch

    @property
    def shortfall(self) -> int:
        return 0 if self.usable is None else max(0, self.need - self.usable)

    def describe_blocks(self) -> str:
        runs, start = [], None
        for i, b in enumerate(self.blocks):
            if start is None:
                start = b
            if i + 1 == len(self.blocks) or self.blocks[i + 1] != b + 1:
                runs.append(f"{start}-{b}" if b > start else f"{start}")
                start = None
        parts = (["home"] if self.home else []) + (["blocks " + ",".join(runs)] if runs else [])
        return " + ".join(parts) or "-"


def device_report(inventory, device: str, usable, weights: int, peak: int, block_devices, home: str,
                  prefetch: int = 0) -> DeviceReport:
    """``device``'s row: its inventory entry (a device it does not list: ``CPU``, no sizes), the
    blocks ``block_devices`` put there, whether it is ``home``."""
    info = inventory.get(device) if device in inventory.names else None
    return DeviceReport(device, info.name if info else "CPU", info.total_bytes if info else 0,
                        info.free_bytes if info else 0, usable, weights, peak,
                        [i for i, d in enumerate(block_devices) if d == device], device == home, prefetch)


@dataclass
class SimulationReport:
    model: str
    family: str
    dtype: str
    size: tuple
    """(width, height, frames) in pixels / frames."""
    latent_shape: tuple
    batch: int
    batch_given: bool
    experts: int
    inventory: object
    plan: object
    """The planner's Plan, or None when it found no placement (then ``plan_error``)."""
    plan_error: str | None
    devices: list
    reserve_vram_gb: float = 0.0
    home_bytes: int = 0
    """Bytes of the DiT's non-block part (on the home device, inside its ``weights``)."""
    seconds: float = 0.0
    rejected: str | None = None
    """Why the larger batch was not chosen (its per-device needs), when ``batch`` was not given."""
    strategies: object = None
    """``strategies.StrategyReport`` when a parallel mode was asked for."""
    workers: object = None
    """``worker_shares.WorkerReport`` when worker devices were listed (distributed `sequence`)."""
    text_encoder: object = None
    """``text_encoders.TextEncoderReport``: the model's text encoder, its size and device (None: unknown)."""
    size_note: str | None = None
    """How the asked size was rounded to the model's token grid, as ComfyUI's latent node does."""

    @property
    def fits(self) -> bool:
        if self.workers is not None:
            return self.workers.ok
        if self.strategies is not None:
            return self.strategies.ok
        return self.blocks_fit

    @property
    def blocks_fit(self) -> bool:
        return self.plan is not None and not any(d.shortfall for d in self.devices)

    @property
    def batch_mode(self) -> str:
        if self.batch == 2:
            return "cond+uncond together (batch 2)"
        if self.batch_given:
            return "batch 1"
        return "cond and uncond one after the other (batch 1): together they do not fit"

    def summarize_needs(self) -> str:
        needs = ", ".join(f"{d.device} {format_gib(d.need)}" + (f" of {format_gib(d.usable)}" if d.usable else "")
                          for d in self.devices)
        return f"batch {self.batch} would need {needs} GiB"

    def shortfalls(self) -> dict:
        return {d.device: d.shortfall for d in self.devices if d.shortfall}

    def to_dict(self) -> dict:
        return {
            "model": self.model, "dtype": self.dtype, "size": list(self.size), "batch": self.batch,
            "latent_shape": list(self.latent_shape), "fits": self.fits, "size_note": self.size_note,
            "parallel": self.strategies.to_dict() if self.strategies is not None else None,
            "workers": self.workers.to_dict() if self.workers is not None else None,
            "text_encoder": self.text_encoder.to_dict() if self.text_encoder is not None else None,
            "plan": self.plan.to_dict() if self.plan is not None else None,
            "devices": {d.device: {"weights": d.weights, "peak_activations": d.peak_activations,
                                   "usable": d.usable, "shortfall": d.shortfall, "blocks": d.blocks}
                        for d in self.devices},
        }

    def to_text(self, holdings: dict | None = None) -> str:
        """The report users read; ``holdings`` (device -> (ComfyUI bytes, ShardDiT bytes)) adds
        what is loaded now to the inventory table."""
        w, h, f = self.size
        st = self.strategies
        tail = f"cfg {st.cfg:g}, parallel {st.requested}" if st is not None else self.batch_mode
        if self.workers is not None:
            tail = f"parallel sequence with worker devices (this machine keeps their shares in RAM, on cpu); {tail}"
        lines = [f"[ShardDiT] plan: {self.model} ({self.family}), {self.dtype}, {w}x{h}x{f} frames, "
                 f"latent {'x'.join(map(str, self.latent_shape))}, {tail}"]
        if self.size_note:
            lines.append(self.size_note)
        if self.text_encoder is not None:
            lines.append(self.text_encoder.to_text())
        if self.experts > 1:
            lines.append(f"{self.experts} experts of this shape, loaded in turn by ComfyUI: the peak holds one "
                         f"(keeping all {self.experts} resident needs {self.experts}x the weights)")
        lines += ["", "Inventory:", format_inventory(self.inventory, holdings)]
        if not self.inventory.gpus:
            lines.append("No GPU here: pass devices like 'cuda:0=24GiB,cuda:1=24GiB' to simulate GPUs you have elsewhere.")
        title = f"Simulated forward (blocks, {self.batch_mode}):" if st is not None else "Simulated forward:"
        if self.workers is not None:
            title = ("Who holds what on this machine (simulated in blocks mode; sequence peaks below):" if self.plan
                     else "This machine in blocks mode (no placement; not used with worker devices, the sequence "
                          "rows below decide):")
        lines += ["", title, self._device_table()]
        if self.plan is not None and self.plan.notes:
            lines += [f"- {n}" for n in self.plan.notes]
        if self.rejected:
            lines.append(f"- cond+uncond together: {self.rejected}")
        if self.strategies is not None:
            lines += ["", self.strategies.to_text()]
        if self.workers is not None:
            lines += ["", self.workers.to_text()]
        not_counted = NOT_MODELLED
        if self.text_encoder is not None:
            not_counted = not_counted.replace("the text encoder", "the text encoder (its line above)")
        lines += ["", self._verdict(), f"({not_counted}; simulated in {self.seconds:.1f} s)"]
        return "\n".join(lines)

    def _device_table(self) -> str:
        rows = [("device", "holds", "weights", "peak act.", "total", "usable", "verdict")]
        for d in self.devices:
            usable = "-" if d.usable is None else format_gib(d.usable)
            verdict = f"SHORT {format_gib(d.shortfall)} GiB" if d.shortfall else "ok" if self.plan else "no placement"
            rows.append((d.device, d.describe_blocks(), format_gib(d.weights),
                         format_gib(d.peak_activations), format_gib(d.need), usable, verdict))
        return format_table(rows, right=(2, 3, 4, 5)) + "\n(GiB)"

    def _verdict(self) -> str:
        if self.workers is not None and self.workers.planned:
            short = [f"{dev} short by {format_gib(n)} GiB" for dev, n in self.workers.shortfalls().items()]
            if short:
                fix = ("SHARDDIT_DIST_WEIGHTS=share (--dist-weights share: each worker keeps its share only), "
                       if self.workers.keep_all else "")
                return ("DOES NOT FIT: " + "; ".join(short) + f".\nFix: {fix}more worker devices (each takes an "
                        "equal share, so less), free memory there, or fewer frames or a smaller size.")
            n, k = len(self.workers.host_peaks), len(self.workers.needs)
            return f"FITS: sequence over {n} device(s) of this machine and {k} worker device(s)."
        st = self.strategies
        if st is not None and st.chosen == "sequence":
            n = len(st.devices.get("sequence", []))
            how = "cond+uncond split first, then tokens" if st.cfg > 1 else "batch 1, tokens split"
            if getattr(st, "sequence_lean", False):
                how = "lean: cond, then uncond, each with its tokens split over every GPU"
            return (f"FITS: sequence over {n} GPUs ({how})." if st.ok
                    else f"DOES NOT FIT: sequence over {n} GPUs (see its rows).")
        if self.blocks_fit:
            return f"FITS: {self.batch_mode}."
        parts = [f"{dev} short by {format_gib(n)} GiB" for dev, n in self.shortfalls().items()]
        core = st.core_fits() if st is not None else ""
        text = ("DOES NOT FIT with ShardDiT: " if core else "DOES NOT FIT: ") + ("; ".join(parts) or "no placement") + "."
        if core:
            text += f"\nBut {core}."
        if self.plan_error:
            text += f"\nPlanner: {self.plan_error}"
        return text + ("\nFix: fewer frames or a smaller size, fp8 weights, more or larger GPUs, "
                       "or a lower --reserve-vram-gb.")


def format_table(rows, right=()) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = [" | ".join(str(c).rjust(w) if i in right else str(c).ljust(w)
                        for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def format_inventory(inventory, holdings: dict | None = None) -> str:
    """Device | name | total | free [| held by ComfyUI | held by ShardDiT] (GiB)."""
    head = ("device", "name", "total", "free")
    extra = ("ComfyUI holds", "ShardDiT holds") if holdings is not None else ()
    rows = [head + extra]
    for d in inventory.devices:
        row = (d.device, d.name, format_gib(d.total_bytes), format_gib(d.free_bytes))
        if holdings is not None:
            comfy, ours = holdings.get(d.device, (0, 0))
            row += (format_gib(comfy), format_gib(ours))
        rows.append(row)
    return format_table(rows, right=tuple(range(2, len(rows[0])))) + f"\n(GiB; source: {inventory.source})"
