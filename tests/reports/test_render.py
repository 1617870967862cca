"""`replayssm-eval report`: every section and image, in the HTML opened by headless Chromium and in the Markdown."""

import json
import re
import shutil
import subprocess
import tempfile

import pytest

from replayssm_eval.cli import main
from replayssm_eval.reports.render import SECTION_IDS

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# written into the page by the test: what the browser decoded, read back from --dump-dom
_PROBE = """<script>
window.addEventListener('load', () => {
  const images = [...document.images];
  const out = document.createElement('pre');
  out.id = 'probe';
  out.textContent = JSON.stringify({
    images: images.length,
    decoded: images.filter(i => i.complete && i.naturalWidth > 100 && i.naturalHeight > 100).length,
    sections: [...document.querySelectorAll('section')].map(s => [s.id, s.querySelectorAll('img').length,
                                                                  s.querySelectorAll('table').length,
                                                                  s.innerText.length]),
  });
  document.body.appendChild(out);
});
</script>"""


def _render(results_dir, tmp_path, *paths):
    out = tmp_path / "report"
    assert main(["report", *(str(p) for p in paths or [results_dir]), "--output", str(out)]) == 0
    return out


def browser_probe(html_path, tmp_path) -> dict:
    page = tmp_path / "probe.html"
    page.write_text(html_path.read_text().replace("</body>", _PROBE + "</body>"))
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
             "--virtual-time-budget=10000", "--dump-dom", page.as_uri()],
            capture_output=True, text=True, timeout=120, check=False)
    match = re.search(r'<pre id="probe">(.*?)</pre>', done.stdout, re.DOTALL)
    assert match, f"no probe in the dumped DOM; chromium said: {done.stderr[-2000:]}"
    return json.loads(match.group(1).replace("&quot;", '"'))


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (.ci/run installs it)")
def test_every_section_and_image_renders_in_chromium(results_dir, tmp_path):
    out = _render(results_dir, tmp_path)
    probe = browser_probe(out / "report.html", tmp_path)
    sections = {sid: (imgs, tabs, text) for sid, imgs, tabs, text in probe["sections"]}
    assert list(sections) == list(SECTION_IDS)
    assert all(text > 50 for _, _, text in sections.values())
    # 2 KL plots, 1 accuracy plot, 2 traffic plots (one per model), 2 Pareto plots
    assert {sid: v[0] for sid, v in sections.items()} == {
        "summary": 0, "kl-vs-length": 2, "kl-buckets": 0, "accuracy": 1, "traffic": 2, "pareto": 2, "sensitivity": 0,
        "provenance": 0}
    assert probe["images"] == probe["decoded"] == 7
    # KL: the bucket table and the statistics table of each run; accuracy: the gap and degeneration tables
    assert sections["kl-buckets"][1] == 4 and sections["accuracy"][1] == 2 and sections["provenance"][1] == 3


def test_html_is_self_contained_and_markdown_links_its_pngs(results_dir, tmp_path):
    out = _render(results_dir, tmp_path)
    html = (out / "report.html").read_text()
    assert html.count('src="data:image/png;base64,') == 7
    assert not re.search(r'(src|href)="(?!data:|#)', html), "the page must not load anything"
    md = (out / "report.md").read_text()
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert len(images) == 7 and all((out / name).stat().st_size > 1000 for name in images)
    for sid in SECTION_IDS:
        assert f'<section id="{sid}">' in html and f'<a id="{sid}"></a>' in md
    assert "| 1–900 | 66 | 62.0 | -12.0 [-20.0, -4.0]* (−10/+2) | +1.0 [-5.0, +7.0] (−3/+4) | – |" in md
    assert "fedcba9876543210 (uncommitted changes)" in md


def test_no_accuracy_results_says_so(results_dir, tmp_path):
    out = _render(results_dir, tmp_path, results_dir / "kl-nano")
    html = (out / "report.html").read_text()
    assert "No accuracy results given" in html
    assert html.count("data:image/png") == 3


def test_accuracy_only_report(results_dir, tmp_path):
    out = _render(results_dir, tmp_path, results_dir / "acc-nano" / "accuracy.json")
    html = (out / "report.html").read_text()
    assert "No KL results given" in html
    assert "computed from the model config" in html  # traffic from the model's preset, not from JSON


def test_bad_result_path(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
