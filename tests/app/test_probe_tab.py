"""The app's probe section opens saved reports only: the bundled example draws, a crafted or
oversized upload is one line, no component takes a URL (a Space never contacts an address a
visitor chose), report text cannot load anything into the page, and the largest report a public
app accepts parses and first renders within 3 s of CPU."""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from specviz.app import files, probe_tab, uploads
from specviz.errors import SpecvizError
from specviz.probe import report as rp
from specviz.probe import report_read as rr
from specviz.views import probe as views


def test_bundled_report_opens_and_draws() -> None:
    names = probe_tab.bundled_reports()
    assert "probe-example.json" in names
    report = probe_tab.load_bundled_report("probe-example.json")
    assert probe_tab.summary_html(report).startswith(f"<p><b>verdict: {report.verdict}</b>")
    with pytest.raises(SpecvizError):
        probe_tab.load_bundled_report("../README.md")  # names from the list only


@pytest.mark.parametrize(
    "content, message",
    [
        (b"\x1f\x8b not json", "not a JSON file"),
        (json.dumps({"format": "specviz-trace"}).encode(), "not a specviz probe report"),
        (json.dumps({"format": "specviz-probe", "version": 99}).encode(), "version 99"),
    ],
)
def test_bad_uploads_are_one_line_and_deleted(content: bytes, message: str) -> None:
    folder = Path(tempfile.mkdtemp(dir=files.gradio_temp_root()))  # where Gradio puts an upload
    upload = folder / "r.json"
    upload.write_bytes(content)
    uploads.UPLOADS.uploaded([upload])  # as the app's /upload and the event that queued it record
    uploads.UPLOADS.claim("visitor", [upload])
    with pytest.raises(SpecvizError) as info:
        probe_tab.load_uploaded_report(str(upload), "visitor")
    assert message in str(info.value) and "\n" not in str(info.value)
    assert not upload.exists()  # read once, then gone


def test_oversized_upload_is_refused_before_it_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    upload = tmp_path / "big.json"
    upload.write_bytes(b" " * 2048)
    monkeypatch.setattr(probe_tab, "MAX_REPORT_UPLOAD_BYTES", 1024)
    uploads.UPLOADS.uploaded([upload])
    uploads.UPLOADS.claim("visitor", [upload])
    with pytest.raises(SpecvizError, match="limit of a probe report"):
        probe_tab.load_uploaded_report(str(upload), "visitor")


def test_no_component_of_the_page_takes_a_url(monkeypatch: pytest.MonkeyPatch) -> None:
    import app

    config = app.build_app().get_config_file()
    labels = [str(c.get("props", {}).get("label") or "").lower() for c in config["components"]]
    assert any("bundled report" in label for label in labels)
    assert not any("url" in label or "server address" in label for label in labels)


def test_the_sweep_report_draws_its_levels_rounds_and_collapse() -> None:
    """traces/probe-sweep.json (tools/make_probe_example.sh): 4 levels, 3 rounds, a collapse."""
    report = probe_tab.load_bundled_report("probe-sweep.json")
    sweep = views.sweep_plot(report)
    rate, acceptance = sweep.data
    assert list(rate.x) == [v.concurrency for v in report.levels] == [1, 2, 4, 8]
    assert list(rate.y) == [v.rate for v in report.levels]
    assert list(acceptance.marker.symbol) == ["circle", "x", "x", "x"]  # collapsed levels marked
    assert f"collapses at {report.collapse.concurrency}" in sweep.layout.title.text
    bars = views.rounds_plot(report).data[0]
    assert len(bars.x) == sum(1 for p in report.prompts if p.diverged_rounds)
    assert all(0 < y <= 1 for y in bars.y)
    summary = probe_tab.summary_html(report)
    assert "acceptance collapse" in summary and "carry no logprob" in summary and "next:" in summary
    plain = probe_tab.load_bundled_report("probe-example.json")
    assert "no concurrency sweep" in views.sweep_plot(plain).layout.title.text


EVIL = [
    "![](http://198.51.100.7/beacon.png)",
    "[click](javascript:alert(1))",
    "<img src=x onerror=alert(1)>",
    "<a href='http://198.51.100.7/'>x</a>",
    "<script>alert(1)</script>",
    "javascript:alert(1)",
]
ALLOWED_TAGS = {"p", "b", "div", "span", "mark"}


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))


def _check_html(html: str) -> None:
    """Only the section's own tags, and no attribute that could load or run anything."""
    parser = _Tags()
    parser.feed(html)
    for tag, attrs in parser.tags:
        assert tag in ALLOWED_TAGS, (tag, html[:300])
        assert all(name in ("class", "style") for name, _ in attrs), (tag, attrs)
        assert all("url(" not in (value or "") for _, value in attrs)


def _crafted(evil: str) -> rp.ProbeReport:
    """The bundled example with every free-text field of a version-2 report set to `evil`."""
    report = probe_tab.load_bundled_report("probe-example.json")
    acceptance = rp.Acceptance(evil, 4, 10, 8, 0.8, 0.5, 0.9, 2.0, evil)
    side = dataclasses.replace(report.side_a, label=evil, url=evil, model=evil, acceptance=acceptance, placeholders=3)
    prompts = tuple(
        dataclasses.replace(
            p, prompt=evil, reason=evil, context=evil, path=evil, rounds=4, diverged_rounds=1,
            findings=(rp.Finding(evil, evil),),
            token_a=dataclasses.replace(p.token_a, text=evil) if p.token_a else None,
            token_b=dataclasses.replace(p.token_b, text=evil) if p.token_b else None,
        )
        for p in report.prompts
    )  # fmt: skip
    level = rp.Level(4, 16, 7, 0.4, 0.2, 0.6, {"numerical": 7, evil: 1}, "numerical", 0.05, 3, 9, acceptance, True)
    noise = dataclasses.replace(
        report.noise,
        calibration=rp.Calibration(evil, 3, 0.1, 0.1),
        paths=(rp.PathNoise(evil, 3, 0.1, 0.1, 0.1, 0.1, 0.1, True),),
    )
    return dataclasses.replace(
        report, side_a=side, side_b=side, prompts=prompts, noise=noise, rounds=4, levels=(level,),
        collapse=rp.Collapse(4, 0.8, 0.1, evil), next_steps=(evil,),
    )  # fmt: skip


@pytest.mark.parametrize("evil", EVIL)
def test_report_text_cannot_load_anything_into_the_page(evil: str) -> None:
    """Every string a report carries, set to an image, a link, a script or raw HTML: the report
    still opens (through the loader, as an upload would), and the summary, the answers and every
    plot carry it only as escaped text."""
    report = rr.parse_report(json.loads(json.dumps(rp.to_dict(_crafted(evil)))))
    summary = probe_tab.summary_html(report)
    _check_html(summary)
    assert "<img" not in summary and "<script" not in summary and "<a " not in summary
    for p in report.prompts:
        _check_html(views.answers_html(report, p.index))
    figures = [views.divergence_map(report), views.noise_vs_swing(report), views.sweep_plot(report)]
    figures.append(views.rounds_plot(report))
    for figure in figures:
        text = figure.to_json()
        assert "<img" not in text and "<a " not in text and "<script" not in text
    assert all(label.split()[0].startswith("#") for label, _ in probe_tab.prompt_choices(report))


def test_a_crafted_enum_is_refused_without_quoting_it() -> None:
    data = rp.to_dict(probe_tab.load_bundled_report("probe-example.json"))
    data["noise"]["source"] = EVIL[0]
    with pytest.raises(SpecvizError) as info:
        probe_tab._parse(json.dumps(data).encode(), "r.json")
    assert "noise.source" in str(info.value) and "http" not in str(info.value)


def largest_report(prompts: int, budget: int = probe_tab.MAX_REPORT_UPLOAD_BYTES) -> bytes:
    """A version-2 report of `prompts` diverged prompts, each field filled, with its reasons
    padded so that the file just fits the upload budget: the costliest report an upload can be
    (as issue 34 built it: every prompt diverged, the most prompts that fit)."""
    base = probe_tab.load_bundled_report("probe-example.json")
    template = next(p for p in base.prompts if p.divergence is not None)
    template = dataclasses.replace(
        template, findings=(rp.Finding("loop", "side B ends in a loop"),), rounds=20, diverged_rounds=3
    )
    levels = tuple(
        rp.Level(n, prompts, prompts // 2, 0.5, 0.4, 0.6, {"numerical": prompts // 2}, "numerical", 0.05, 0, 0, None,
                 False) for n in (1, 2, 4, 8, 16)
    )  # fmt: skip
    report = dataclasses.replace(
        base, version=rp.VERSION, prompts=tuple(dataclasses.replace(template, index=i) for i in range(prompts)),
        levels=levels, rounds=20,
    )  # fmt: skip
    raw = json.dumps(rp.to_dict(report)).encode()
    pad = max(0, (budget - len(raw) - 1024) // prompts - 1)
    data = rp.to_dict(report)
    for p in data["prompts"]:
        p["reason"] = (p["reason"] + " " + "x" * pad)[: rp.MAX_TEXT]
    raw = json.dumps(data).encode()
    assert len(raw) <= budget
    return raw


def first_render(raw: bytes, public: bool) -> float:
    """CPU seconds to parse an upload and draw everything the section shows when it opens."""
    started = time.process_time()
    report = probe_tab._parse(raw, "big.json", public=public)
    probe_tab.summary_html(report)
    for figure in (views.divergence_map(report), views.noise_vs_swing(report), views.sweep_plot(report)):
        figure.to_json()  # what Gradio sends
    views.rounds_plot(report).to_json()
    choices = probe_tab.prompt_choices(report)
    views.answers_html(report, choices[0][1])
    assert len(choices) <= views.MAX_MAP_PROMPTS
    return time.process_time() - started


def test_the_largest_public_report_parses_and_renders_within_3_s() -> None:
    raw = largest_report(probe_tab.PUBLIC_MAX_PROMPTS)
    assert first_render(raw, public=True) < 3.0
    with pytest.raises(SpecvizError, match="at most 5,000"):
        probe_tab._parse(largest_report(probe_tab.PUBLIC_MAX_PROMPTS + 1, budget=2**30), "big.json", public=True)
