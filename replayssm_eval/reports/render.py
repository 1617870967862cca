"""Build a report from results and write it: one self-contained HTML page (PNGs embedded as base64) and
a Markdown file with the same PNGs beside it.

    report = build_report(load_results(paths))
    write_report(report, "reports/report-...")     # report.html, report.md, *.png

Sections (their HTML ids): summary, kl-vs-length, kl-buckets, accuracy, traffic, pareto, sensitivity,
provenance.
A section without data says so in a note; it is never left out.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from pathlib import Path

from replayssm_eval.reports import plots, sensitivity, tables
from replayssm_eval.reports.load import Result
from replayssm_eval.reports.tables import Table

SECTION_IDS = ("summary", "kl-vs-length", "kl-buckets", "accuracy", "traffic", "pareto", "sensitivity", "provenance")


@dataclass(frozen=True)
class Image:
    name: str  # file name of the PNG beside the Markdown
    png: bytes
    alt: str


@dataclass(frozen=True)
class Note:
    text: str


@dataclass
class Section:
    id: str
    title: str
    blocks: list = field(default_factory=list)  # Table | Image | Note, in order
    side_by_side: bool = False  # images of several runs in a row


@dataclass
class Report:
    title: str
    sections: list[Section]

    @property
    def images(self) -> list[Image]:
        return [b for s in self.sections for b in s.blocks if isinstance(b, Image)]


def build_report(results: list[Result], title: str = "ReplaySSM state formats") -> Report:
    kl = [r for r in results if r.kind == "kl"]
    acc = [r for r in results if r.kind == "accuracy"]
    sens = [r for r in results if r.kind == "sensitivity"]
    models = list(dict.fromkeys(r.model for r in results))
    sections = [
        Section("summary", "Summary", [Note(
            f"{len(kl)} KL run(s), {len(acc)} accuracy run(s) and {len(sens)} sensitivity stud(ies) of "
            f"{', '.join(models)}. Every number below is rendered from the runs' JSON (kl.json, accuracy.json, "
            "sensitivity.json)."), *([tables.kl_summary_table(kl)] if kl else [])]),
        _kl_vs_length(kl), _kl_buckets(kl), _accuracy(acc), _traffic(kl + acc), _pareto(kl), _sensitivity(sens),
        Section("provenance", "Provenance", [tables.provenance_table(r) for r in results]),
    ]
    return Report(title, sections)


def _no_kl(section: Section) -> Section:
    section.blocks.append(Note("No KL results given (pass a kl run directory, see `replayssm-eval kl`)."))
    return section


def _kl_vs_length(kl: list[Result]) -> Section:
    section = Section("kl-vs-length", "KL against generated length", side_by_side=True)
    if not kl:
        return _no_kl(section)
    for r in kl:
        section.blocks.append(Image(f"{r.slug}-kl_vs_length.png", plots.kl_vs_length_png(r.data),
                                    f"KL against generated length, {r.label}"))
    section.blocks.append(Note("Mean KL(p_fp32 || p_config) per length bucket, log-log; the band is the 95% "
                               "interval over documents (none with one document)."))
    return section


def _kl_buckets(kl: list[Result]) -> Section:
    section = Section("kl-buckets", "KL per length bucket")
    if not kl:
        return _no_kl(section)
    section.blocks += [t for r in kl for t in (tables.kl_bucket_table(r), tables.kl_statistics_table(r))]
    return section


def _accuracy(acc: list[Result]) -> Section:
    section = Section("accuracy", "Accuracy gap to FP32 per length bucket")
    if not acc:
        section.blocks.append(Note("No accuracy results given: pass an accuracy run directory (accuracy.json, "
                                   "from `replayssm-eval accuracy`) to fill this section."))
        return section
    for r in acc:
        for table, task in zip(tables.accuracy_tables(r), r.data["tasks"]):
            section.blocks.append(table)
            png = plots.accuracy_gap_png(r, task)
            if png:
                section.blocks.append(Image(f"{r.slug}-{_safe(task)}-accuracy_gap.png", png,
                                            f"accuracy change per bucket, {r.label}, {task}"))
        section.blocks += tables.degeneration_tables(r)
    return section


def _traffic(results: list[Result]) -> Section:
    section = Section("traffic", "State memory traffic per decode token", side_by_side=True)
    rows = tables.traffic_rows(results)
    if not rows:
        section.blocks.append(Note("No configs in the given results."))
        return section
    section.blocks.append(tables.traffic_table(rows))
    for model in dict.fromkeys(r.model for r in rows):
        png = plots.traffic_png(model, [r for r in rows if r.model == model])
        if png:
            section.blocks.append(Image(f"traffic-{_safe(model)}.png", png, f"state traffic per config, {model}"))
    return section


def _pareto(kl: list[Result]) -> Section:
    section = Section("pareto", "Traffic against KL at the longest bucket", side_by_side=True)
    if not kl:
        return _no_kl(section)
    for r in kl:
        points, bucket = tables.pareto_points(r)
        traffic = next((c["state_traffic"]["per_model"]["conventional_fp32"] for c in r.data["configs"]
                        if c.get("state_traffic")), None)
        png = plots.pareto_png(r, points, bucket, traffic)
        if png:
            section.blocks.append(Image(f"{r.slug}-pareto.png", png, f"traffic against KL, {r.label}"))
        section.blocks.append(tables.pareto_table(r, points, bucket))
    section.blocks.append(Note("A config is on the frontier when no other config of the run has both less traffic "
                               "and less KL. The FP32 reference (KL 0) is the dashed line; the right panel puts the "
                               "same KL against the read copy's bits per element."))
    section.blocks.append(tables.formats_table(kl))
    return section


def _sensitivity(sens: list[Result]) -> Section:
    section = Section("sensitivity", "Which layers and heads need precision")
    if not sens:
        section.blocks.append(Note("No sensitivity results given: pass a sensitivity study's directory "
                                   "(sensitivity.json, from `replayssm-eval sensitivity`) to fill this section."))
        return section
    for r in sens:
        section.blocks += [sensitivity.ranked_table(r),
                           Image(f"{r.slug}-layers.png", sensitivity.layer_heatmap_png(r),
                                 f"KL per SSM layer and length bucket, {r.label}")]
        section.blocks += [t for t in (sensitivity.budget_table(r), sensitivity.budget_units_table(r)) if t]
        heads = sensitivity.heads_table(r)
        if heads:
            section.blocks += [heads, Image(f"{r.slug}-heads.png", sensitivity.head_heatmap_png(r),
                                            f"KL per SSM layer and head, {r.label}")]
    return section


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


# --- HTML --------------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 1400px;
       padding: 0 1rem; color: #1a202c; }
h1 { font-size: 1.6rem; } h2 { border-bottom: 1px solid #cbd5e0; padding-bottom: .2rem; margin-top: 2rem; }
h3 { font-size: 1rem; margin: 1.2rem 0 .4rem; }
table { border-collapse: collapse; font-size: .82rem; margin: .3rem 0 .6rem; }
th, td { border: 1px solid #e2e8f0; padding: .2rem .5rem; vertical-align: top; }
th { background: #edf2f7; } td.r { text-align: right; font-variant-numeric: tabular-nums; }
.note { color: #4a5568; font-size: .85rem; max-width: 60rem; }
.row { display: flex; flex-wrap: wrap; gap: 1rem; align-items: flex-start; }
.row figure { flex: 1 1 30rem; max-width: calc(50% - .5rem); }
figure { margin: .5rem 0; } img { max-width: 100%; border: 1px solid #e2e8f0; }
figcaption { font-size: .8rem; color: #4a5568; } .scroll { overflow-x: auto; } nav a { margin-right: 1rem; }
"""


def to_html(report: Report) -> str:
    esc = html.escape
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{esc(report.title)}</title><style>{_CSS}</style></head><body>",
           f"<h1>{esc(report.title)}</h1>",
           "<nav>" + "".join(f'<a href="#{s.id}">{esc(s.title)}</a>' for s in report.sections) + "</nav>"]
    for s in report.sections:
        out.append(f'<section id="{s.id}"><h2>{esc(s.title)}</h2>')
        images = [b for b in s.blocks if isinstance(b, Image)]
        for b in s.blocks:
            if isinstance(b, Table):
                out.append(_html_table(b))
            elif isinstance(b, Note):
                out.append(f'<p class="note">{esc(b.text)}</p>')
            elif not s.side_by_side:
                out.append(_html_image(b))
            elif b is images[0]:  # the section's images in one row, where the first one stands
                out.append('<div class="row">' + "".join(_html_image(i) for i in images) + "</div>")
        out.append("</section>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _html_image(image: Image) -> str:
    data = base64.b64encode(image.png).decode("ascii")
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(image.alt)}" '
            f'data-name="{html.escape(image.name)}"><figcaption>{html.escape(image.alt)}</figcaption></figure>')


def _html_table(table: Table) -> str:
    esc = html.escape
    align = table.alignment()
    head = "".join(f"<th>{esc(c)}</th>" for c in table.columns)
    body = "".join("<tr>" + "".join(f'<td class="{a}">{esc(v)}</td>' for v, a in zip(row, align)) + "</tr>"
                   for row in table.rows)
    note = f'<p class="note">{esc(table.note)}</p>' if table.note else ""
    return (f'<h3>{esc(table.title)}</h3><div class="scroll"><table><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>{note}")


# --- Markdown ----------------------------------------------------------------------------------

def to_markdown(report: Report) -> str:
    out = [f"# {report.title}", ""]
    for s in report.sections:
        out += [f"## {s.title}", f'<a id="{s.id}"></a>', ""]
        for b in s.blocks:
            if isinstance(b, Table):
                out += markdown_table(b)
            elif isinstance(b, Note):
                out += [b.text, ""]
            elif isinstance(b, Image):
                out += [f"![{b.alt}]({b.name})", ""]
    return "\n".join(out)


def markdown_table(table: Table) -> list[str]:
    """The Markdown lines of `table`: its title (###), the table and its note."""
    cell = lambda v: str(v).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    rule = ["---:" if a == "r" else "---" for a in table.alignment()]
    lines = [f"### {table.title}", "", "| " + " | ".join(cell(c) for c in table.columns) + " |",
             "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.rows]
    if table.note:
        lines += ["", table.note]
    return lines + [""]


def accuracy_markdown(result: Result) -> str:
    """accuracy.md of an accuracy run: its sampling settings, then per task its lm-eval task and the accuracy and
    degeneration tables exactly as the report shows them."""
    data = result.data
    out = [f"# Accuracy vs FP32 state: {result.model}", ""]
    if not data.get("complete", True):
        out += ["**Incomplete run**: only finished (config, task) pairs are shown.", ""]
    sampling = data.get("sampling") or {"do_sample": False}
    if sampling["do_sample"]:
        out += [f"Sampled: temperature {sampling['temperature']}, top_p {sampling['top_p']}, top_k {sampling['top_k']}, "
                f"seed {sampling['seed']}, {sampling['samples']} samples per question; accuracy is avg@{sampling['samples']} "
                "(the mean over questions of each question's mean over its samples); sample j of a question is drawn "
                "with the same random numbers under every config.", ""]
    for task, entry in data["tasks"].items():
        out += [f"## {task}", "", f"`{entry['lm_eval_task']}`, {entry['metric']} ({entry['filter']}), "
                f"{entry['n']} questions", ""]
        out += markdown_table(tables.accuracy_table(result, task))
        degeneration = tables.degeneration_table(result, task)
        if degeneration is not None:
            out += markdown_table(degeneration)
    return "\n".join(out)


def write_report(report: Report, output: Path) -> tuple[Path, Path]:
    """Write report.html, report.md and the PNGs into `output`; returns the HTML and Markdown paths."""
    from replayssm_eval.results.files import atomic_write_bytes

    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    for image in report.images:
        atomic_write_bytes(output / image.name, image.png)
    html_path, md_path = output / "report.html", output / "report.md"
    atomic_write_bytes(html_path, to_html(report).encode("utf-8"))
    atomic_write_bytes(md_path, to_markdown(report).encode("utf-8"))
    return html_path, md_path
