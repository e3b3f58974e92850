"""The plan picture (loaders/plan/picture.py): bars measured in pixels (CI, needs Pillow)."""
import pytest
from harness.require import import_or_skip

from sharddit.loaders.plan import picture as plan_picture
from sharddit.loaders.plan.findings import DeviceReport, SimulationReport
from sharddit.parallel.placement.inventory import inventory_from_spec

PIL = import_or_skip("PIL", "Pillow not installed (pip install pillow; it is in tests/requirements.txt and ComfyUI's)")
GiB = 1 << 30
COLOURS = {k: c for k, _, c in plan_picture.SEGMENTS}


def _report(devices, spec="cuda:0=24GiB,cuda:1=12GiB/16GiB", plan=object(), reserve=1.0, batch=2):
    return SimulationReport("wan2.1-t2v-14b", "wan", "fp8", (832, 480, 81), (batch, 16, 21, 60, 104), batch,
                            False, 1, inventory_from_spec(spec), plan, None, devices, reserve_vram_gb=reserve,
                            home_bytes=GiB // 2)


def _fits():
    # cuda:0: 24 total, 24 free, reserve 1 -> usable 23; home 0.5 + blocks 7.5 + act 6
    # cuda:1: 16 total, 12 free (4 used by others), reserve 1 -> usable 11; blocks 4 + act 6
    return _report([DeviceReport("cuda:0", "spec", 24 * GiB, 24 * GiB, 23 * GiB, 8 * GiB, 6 * GiB, list(range(20)), True),
                    DeviceReport("cuda:1", "spec", 16 * GiB, 12 * GiB, 11 * GiB, 4 * GiB, 6 * GiB, list(range(20, 30)))])


def _runs(img, y, colour):
    """Pixel count of ``colour`` along row ``y``."""
    return sum(1 for x in range(img.width) if img.getpixel((x, y)) == colour)


def _bar_rows(img, pic):
    """y of a pixel row inside each device's bar, above the GiB labels."""
    return [48 + 20 * len(pic.subtitle.splitlines()) + 54 * i + 4 + 4 for i in range(len(pic.bars))]


def test_segments_from_report():
    pic = plan_picture.picture_from_report(_fits())
    assert pic.fits and pic.title.startswith("FITS - strategy: blocks split over cuda:0, cuda:1")
    a, b = pic.bars
    assert a.segments == {"other": 0, "home": GiB // 2, "blocks": 15 * GiB // 2, "activations": 6 * GiB,
                          "free": 9 * GiB, "reserve": GiB}
    assert a.capacity == 24 * GiB and a.usable_at == 23 * GiB
    assert b.segments["other"] == 4 * GiB and b.segments["free"] == GiB and b.usable_at == 15 * GiB


def test_bars_are_drawn_to_scale():
    pic = plan_picture.picture_from_report(_fits())
    img = plan_picture.draw_plan_picture(pic)
    y0, y1 = _bar_rows(img, pic)
    blocks0, blocks1 = _runs(img, y0, COLOURS["blocks"]), _runs(img, y1, COLOURS["blocks"])
    act0 = _runs(img, y0, COLOURS["activations"])
    assert blocks0 > 0 and blocks1 > 0 and act0 > 0
    # 7.5 GiB vs 4 GiB of blocks and 6 GiB of activations, same scale on both rows (± text labels)
    assert blocks0 / blocks1 == pytest.approx(7.5 / 4, rel=0.12)
    assert act0 / blocks0 == pytest.approx(6 / 7.5, rel=0.12)
    assert _runs(img, y1, COLOURS["other"]) / blocks1 == pytest.approx(1.0, rel=0.12)
    assert _runs(img, y0, COLOURS["reserve"]) > 0
    # the title is green when it fits
    assert any(img.getpixel((x, 24)) == plan_picture._OK for x in range(16, 200))


def test_short_device_overhangs_and_title_is_red():
    short = DeviceReport("cuda:1", "spec", 16 * GiB, 12 * GiB, 11 * GiB, 10 * GiB, 6 * GiB, list(range(20, 40)))
    ok = DeviceReport("cuda:0", "spec", 24 * GiB, 24 * GiB, 23 * GiB, 8 * GiB, 6 * GiB, list(range(20)), True)
    report = _report([ok, short])
    pic = plan_picture.picture_from_report(report)
    assert not pic.fits and pic.title.startswith("DOES NOT FIT") and pic.bars[1].short == 5 * GiB
    img = plan_picture.draw_plan_picture(pic)
    assert any(img.getpixel((x, 24)) == plan_picture._BAD for x in range(16, 200))
    _, y1 = _bar_rows(img, pic)
    # 4 used + 16 needed on a 16 GiB card: the stack runs past the usable line over the reserve
    assert _runs(img, y1, COLOURS["free"]) == 0 and _runs(img, y1, COLOURS["reserve"]) == 0


def test_cpu_row_uses_ram_and_no_plan_is_not_ok():
    cpu = DeviceReport("cpu", "CPU", 32 * GiB, 20 * GiB, 20 * GiB, 26 * GiB, 3 * GiB, list(range(40)), True)
    report = _report([cpu], spec="cpu=20GiB/32GiB", plan=None, reserve=0.0)
    assert "SHORT 9.0 GiB" in report.to_text() and "DOES NOT FIT" in report.to_text()
    pic = plan_picture.picture_from_report(report)
    assert pic.bars[0].segments["reserve"] == 0 and pic.bars[0].usable_at == 32 * GiB
    # no placement and nobody short: rows say so instead of "ok"
    fine = DeviceReport("cpu", "CPU", 32 * GiB, 20 * GiB, 20 * GiB, 2 * GiB, GiB, [0], True)
    text = _report([fine], spec="cpu=20GiB/32GiB", plan=None).to_text()
    assert "no placement" in text and "| ok" not in text
