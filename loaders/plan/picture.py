"""The plan as a picture: one stacked bar per device (what the plan puts there, the reserve, what is
left free) with a line at the memory ShardDiT may use, the verdict and strategy in the title.

Pure: PIL only (in ComfyUI's requirements), no ComfyUI or torch imports. The Plan node shows the
picture through ComfyUI's image preview; ``plan --png FILE`` writes the same picture.
``picture_from_report`` reads a ``SimulationReport`` (duck-typed); ``draw_plan_picture`` draws any
``PlanPicture``, so a placement made by the loaders (text encoder and VAE included) can be drawn too.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...parallel.units import GiB, format_gib

__all__ = ["SEGMENTS", "DeviceBar", "PlanPicture", "draw_plan_picture", "picture_from_report"]

# (key, legend label, fill colour) in stacking order, left to right.
SEGMENTS = (
    ("other", "used by other programs", (150, 150, 150)),
    ("home", "DiT home (embed, head)", (229, 140, 40)),
    ("blocks", "DiT blocks", (66, 133, 244)),
    ("text_encoder", "text encoder", (156, 100, 210)),
    ("vae", "VAE", (0, 170, 160)),
    ("activations", "activations (peak)", (240, 200, 60)),
    ("prefetch", "streamed blocks, 2 per shape (sequence)", (120, 190, 250)),
    ("free", "free", (60, 66, 74)),
    ("reserve", "reserve (reserve_vram_gb)", (150, 60, 60)),
)
_COLOURS = {k: c for k, _, c in SEGMENTS}
_BG, _FG, _DIM = (32, 34, 38), (235, 235, 235), (170, 170, 170)
_OK, _BAD, _LINE = (90, 200, 110), (235, 80, 70), (255, 255, 255)


@dataclass
class DeviceBar:
    """One device: bytes per segment key (``SEGMENTS``), its capacity and usable limit."""

    device: str
    label: str
    """Second line under the device name (e.g. ``blocks 0-19``)."""
    segments: dict
    capacity: int
    """Bar length in bytes (the device's total memory)."""
    usable_at: int | None
    """Where the usable line goes (bytes from the left); None when not checked (cpu)."""
    short: int = 0
    """Bytes the device is short of; drawn as a red overhang."""
    size: str = ""
    """Beside the device name (e.g. ``24.0 GiB``)."""


@dataclass
class PlanPicture:
    title: str
    fits: bool
    bars: list
    footnote: str = ""
    subtitle: str = ""
    """Lines under the title (model, size, batch; why not a larger batch)."""
    extra: dict = field(default_factory=dict)


def picture_from_report(report) -> PlanPicture:
    """A ``SimulationReport`` (loaders/plan/findings.py) as a picture."""
    reserve = int(round(report.reserve_vram_gb * GiB))
    bars = []
    st = getattr(report, "strategies", None)
    devices = st.sequence_reports if st is not None and st.chosen == "sequence" else report.devices
    for d in devices:
        home = min(report.home_bytes, d.weights) if d.home else 0
        prefetch = getattr(d, "prefetch", 0)
        seg = {"home": home, "blocks": d.weights - home, "activations": d.peak_activations}
        if prefetch:
            seg["prefetch"] = prefetch
        need = d.weights + d.peak_activations + prefetch
        if d.usable is None:  # RAM size unknown: the planner assumes enough
            seg["free"] = 0
            bars.append(DeviceBar(d.device, f"{_blocks(d)}, RAM not checked", seg, max(need, 1), None))
            continue
        res = 0 if d.device == "cpu" else reserve
        total = max(d.total, d.usable + res, 1)
        other = max(0, total - (d.usable + res))
        usable_at = other + d.usable
        seg = {"other": other, **seg, "free": max(0, usable_at - other - need), "reserve": res}
        size = f"{format_gib(total)} GiB{' RAM' if d.device == 'cpu' else ''}"
        bars.append(DeviceBar(d.device, _blocks(d), seg, total, usable_at, short=d.shortfall, size=size))
    w, h, f = report.size
    verdict = "FITS" if report.fits else "DOES NOT FIT"
    if report.plan is None and devices is report.devices and not any(b.short for b in bars):
        verdict += " (no placement)"
    strategy = getattr(report, "strategy", None) or _strategy(report)
    if devices is not report.devices:
        split = "cond/uncond split, then tokens" if st.cfg > 1 else "tokens split"
        if getattr(st, "sequence_lean", False):
            split = "lean: cond, then uncond, tokens split"
        lines = [f"{report.model}, {w}x{h}x{f} frames, {report.dtype}, cfg {st.cfg:g}: {split}"]
    else:
        lines = [f"{report.model}, {w}x{h}x{f} frames, {report.dtype}, {report.batch_mode}"]
    if report.rejected and devices is report.devices:
        lines.append(f"cond+uncond together: {report.rejected}")
    if st is not None:
        lines.append(st.decision_line().replace("→", "->").replace("×", "x"))
    footnote = ("Text encoder and VAE not simulated (ComfyUI runs them before and after the DiT); "
                "not counted: CUDA context (~0.5 GiB per GPU), fragmentation.")
    return PlanPicture(f"{verdict} - {strategy}", report.fits, bars, footnote, "\n".join(lines))


def _blocks(d) -> str:
    """``blocks 0-19`` (the home part has its own colour)."""
    return d.describe_blocks().replace("home + ", "").replace("home", "DiT home")


def _strategy(report) -> str:
    st = getattr(report, "strategies", None)
    if st is not None and st.chosen is not None:
        c = st.costs[st.chosen]
        n = len(st.devices.get(st.chosen, []))
        head = "auto -> " if st.requested == "auto" else ""  # ASCII: the bundled font may lack arrows
        where = "1 GPU" if st.chosen == "one_gpu" else f"{st.chosen} on {n} GPUs"
        return f"{head}{where}, {c.speedup:.2f}x vs 1 GPU"
    dit = [d.device for d in report.devices if d.blocks]
    if len(dit) <= 1:
        return f"strategy: one device ({dit[0] if dit else '-'})"
    return f"strategy: blocks split over {', '.join(dit)}"


# ----------------------------------------------------------------------------- drawing
def _font(size: int):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)  # Pillow >= 10.1: a scalable bundled font
    except TypeError:
        return ImageFont.load_default()


def _text_width(draw, text: str, font) -> int:
    x0, _, x1, _ = draw.textbbox((0, 0), text, font=font)
    return x1 - x0


def _wrap(draw, text: str, font, width: int) -> list:
    lines, line = [], ""
    for word in text.split():
        if line and _text_width(draw, f"{line} {word}", font) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return lines + [line] if line else lines


def _fit(draw, text: str, font, width: int) -> str:
    """``text`` cut with an ellipsis to ``width`` pixels."""
    if _text_width(draw, text, font) <= width:
        return text
    while text and _text_width(draw, text + "...", font) > width:
        text = text[:-1]
    return text + "..."


def draw_plan_picture(pic: PlanPicture, width: int = 600):
    """A PIL RGB image of ``pic``: title, one bar per device, a usable line, a legend."""
    from PIL import Image, ImageDraw

    f_title, f_text, f_small = _font(20), _font(15), _font(13)
    label_w, pad, row_h, bar_h = 140, 12, 54, 30
    used = [k for k, _, _ in SEGMENTS if any(b.segments.get(k, 0) > 0 for b in pic.bars)]
    cols = max(2, (width - 2 * pad) // 190)
    legend_rows = (len(used) + cols - 1) // cols
    subtitle = pic.subtitle.splitlines()
    top = 48 + 20 * len(subtitle)
    foot = _wrap(ImageDraw.Draw(Image.new("RGB", (1, 1))), pic.footnote, f_small, width - 2 * pad)
    height = top + row_h * len(pic.bars) + 14 + 22 * legend_rows + 34 + 18 * len(foot)
    img = Image.new("RGB", (width, height), _BG)
    draw = ImageDraw.Draw(img)
    draw.text((pad, 14), _fit(draw, pic.title, f_title, width - 2 * pad), fill=_OK if pic.fits else _BAD, font=f_title)
    for i, line in enumerate(subtitle):
        draw.text((pad, 44 + 20 * i), _fit(draw, line, f_text if i == 0 else f_small, width - 2 * pad),
                  fill=_FG if i == 0 else _DIM, font=f_text if i == 0 else f_small)
    x0, x1 = pad + label_w, width - pad - 72
    scale_max = max([b.capacity for b in pic.bars] + [1]
                    + [sum(v for k, v in b.segments.items() if k not in ("free", "reserve")) for b in pic.bars])
    px = (x1 - x0) / scale_max
    for i, bar in enumerate(pic.bars):
        y = top + i * row_h
        draw.text((pad, y + 2), bar.device, fill=_FG, font=f_text)
        if bar.size:
            draw.text((pad + _text_width(draw, bar.device, f_text) + 6, y + 4),
                      _fit(draw, bar.size, f_small, label_w - 14 - _text_width(draw, bar.device, f_text)),
                      fill=_DIM, font=f_small)
        draw.text((pad, y + 22), _fit(draw, bar.label, f_small, label_w - 8), fill=_DIM, font=f_small)
        _draw_bar(draw, bar, x0, y + 4, bar_h, px, f_small)
    y = top + row_h * len(pic.bars) + 10
    col_w = (width - 2 * pad) // cols
    for j, key in enumerate(used):
        lx, ly = pad + (j % cols) * col_w, y + (j // cols) * 22
        draw.rectangle((lx, ly + 3, lx + 14, ly + 15), fill=_COLOURS[key], outline=_DIM)
        draw.text((lx + 20, ly + 1), dict((k, n) for k, n, _ in SEGMENTS)[key], fill=_FG, font=f_small)
    y += 22 * legend_rows + 6
    draw.line((pad, y + 7, pad + 18, y + 7), fill=_LINE, width=3)
    draw.text((pad + 26, y), "usable by ShardDiT (free minus reserve); sizes in GiB", fill=_FG, font=f_small)
    for i, line in enumerate(foot):
        draw.text((pad, y + 22 + 18 * i), line, fill=_DIM, font=f_small)
    return img


def _draw_bar(draw, bar: DeviceBar, x0: int, y: int, h: int, px: float, font) -> None:
    cap_x = round(x0 + bar.capacity * px)
    draw.rectangle((x0, y, cap_x, y + h), outline=_DIM)
    reserve = bar.segments.get("reserve", 0)
    if reserve > 0:  # at the right end of the capacity; what the plan needs is drawn over it
        draw.rectangle((round(x0 + (bar.capacity - reserve) * px), y + 1, cap_x, y + h - 1), fill=_COLOURS["reserve"])
    x = float(x0)
    for key in [k for k, _, _ in SEGMENTS if k != "reserve"]:
        n = bar.segments.get(key, 0)
        if n <= 0:
            continue
        w = n * px
        draw.rectangle((round(x), y + 1, round(x + w), y + h - 1), fill=_COLOURS[key])
        text = format_gib(n)
        if key != "free" and draw.textlength(text, font=font) + 6 < w:
            draw.text((round(x) + 4, y + 8), text, fill=(20, 20, 20), font=font)
        x += w
    if bar.usable_at is not None:
        ux = round(x0 + bar.usable_at * px)
        draw.line((ux, y - 5, ux, y + h + 5), fill=_LINE, width=3)
    end = max(cap_x, round(x))
    if bar.short:
        draw.text((end + 6, y + 8), f"short {format_gib(bar.short)}", fill=_BAD, font=font)
    elif bar.usable_at is not None:
        draw.text((end + 6, y + 8), "ok", fill=_OK, font=font)
